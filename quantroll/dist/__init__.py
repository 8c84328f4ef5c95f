"""quantroll across processes: the trainer under FSDP2, data-parallel engines, the weight
broadcast, and the launch and failure handling around them.

One process per rank (``torchrun`` or Ray actors start them); each rank holds one shard
of the trainer (``fully_shard`` per decoder layer) and, colocated, one whole engine.
Data flows as in one process, with three collectives added:

    rollout:  the batch is split across engines, results gathered in prompt order
    train:    each rank takes its rows, FSDP2 reduce-scatters the summed gradients
    sync:     layer by layer, unshard -> quantize on the source -> broadcast -> load

Nothing here changes a one-process run: the single-process code paths are the same
functions, called without a distributed context.
"""

"""quantroll across processes: the trainer under FSDP2, data-parallel engines, the weight
broadcast, and the launch and failure handling around them.

One process per rank (``torchrun`` or Ray actors start them), in either of Miles'
placements (groups.py): colocated (``--colocate``), each rank holds one shard of the
trainer (``fully_shard`` per decoder layer) and one whole engine; or engines on ranks of
their own (``--rollout-num-gpus R``), the trainer ranks hold the shards and run the loop,
the last R ranks hold one engine each and serve the loop's requests (engine_ranks.py).
Data flows as in one process, with three collectives added:

    rollout:  the batch is split across engines, results gathered in prompt order (and
              sent from the engine ranks to the trainer ranks when they are apart)
    train:    each trainer rank takes its rows, FSDP2 reduce-scatters the summed gradients
    sync:     layer by layer, unshard -> quantize on trainer rank 0 -> broadcast to every
              engine -> load

Nothing here changes a one-process run: the single-process code paths are the same
functions, called without a distributed context.
"""

"""The trainer's policy under FSDP2: ``fully_shard`` per decoder layer, and the units the
weight sync walks.

Precision, and why it is set this way: the parameters FSDP2 shards are the policy's own
(BF16 on a GPU; on a CPU float32 tensors holding BF16 values, quantroll/compute.py), the
FP32 master weights and AdamW moments live, sharded the same way, in the optimizer
(quantroll/distributed/optimizer.py), and gradients are reduce-scattered in float32
(``MixedPrecisionPolicy(reduce_dtype=float32)``). The forward therefore computes on the
rounded BF16 weights exactly as one process does, so the two agree to float rounding.
(FSDP2's other arrangement, FP32 parameters cast to ``param_dtype=bfloat16`` at each
all-gather, computes the same forward on a GPU but cannot express the CPU's "float32
compute on BF16 values": it would compute on unrounded masters there.)

Units: each decoder layer is one FSDP2 group, the embedding and final norm another
(``model.model``, whose forward ``CausalLM.hidden`` calls), ``lm_head`` a third
(``CausalLM.logits`` calls it directly, outside the root's forward). The weight
sync gathers one unit at a time, so its memory is one layer's full weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.errors import QuantrollError


@dataclass(frozen=True)
class ShardUnit:
    """One FSDP2 group: the module and the checkpoint names of the parameters it holds
    (module None on an engine rank, which holds no trainer shard: the names only)."""

    module: torch.nn.Module | None
    names: tuple[str, ...]


def _units_of(policy) -> list[tuple[torch.nn.Module, str]]:
    if policy.config.tie_word_embeddings:
        raise QuantrollError("a model with tied embeddings (tie_word_embeddings) cannot be sharded per unit here: "
                             "its lm_head and embedding are one tensor; train it in one process")
    units = [(layer, f"model.layers.{i}.") for i, layer in enumerate(policy.model.layers)]
    return units + [(policy.model, "model."), (policy.lm_head, "lm_head.")]


def shard_policy(policy, ctx=None) -> list[ShardUnit]:
    """Shard ``policy`` in place over ``ctx``'s process group (the trainer ranks; None or a
    context of the whole world: the default group); returns its units in the order the
    weight sync walks them (the decoder layers, then embedding/norm, lm_head)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = None
    if ctx is not None and ctx.group is not None:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(ctx.group, ctx.device.type)
    mp = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    units, taken = [], set()
    for module, prefix in _units_of(policy):
        fully_shard(module, mesh=mesh, mp_policy=mp)
        mine = tuple(n for n in names if n.startswith(prefix) and n not in taken)
        taken.update(mine)
        units.append(ShardUnit(module, mine))
        # the loss is already normalized by the batch's global token count: gradients sum over ranks
        module.set_gradient_divide_factor(1.0)
        if hasattr(module, "set_force_sum_reduction_for_comms"):  # gloo has no pre-multiplied sum
            module.set_force_sum_reduction_for_comms(True)
        # MoE: an expert no token of this rank chose has no gradient here but one elsewhere;
        # it must still join the reduce-scatter (with zeros), or the ranks' collectives differ
        if hasattr(module, "set_reduce_scatter_unused_params"):
            module.set_reduce_scatter_unused_params(True, recurse=False)
        elif policy.config.num_experts:
            raise QuantrollError("this torch's FSDP2 lacks set_reduce_scatter_unused_params, which a MoE model "
                                 "needs across ranks (experts unused on one rank); upgrade torch or train in one "
                                 "process")
    left = sorted(set(names) - taken)
    if left:
        raise QuantrollError(f"parameter {left[0]} belongs to no FSDP unit; the model has a part quantroll does not "
                             "shard")
    return units


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter's full value, on every rank; a plain tensor as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def local_shard(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full``, laid out as the DTensor ``like`` shards it (FSDP2:
    ``torch.chunk`` along dim 0, the last ranks possibly empty)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(like, DTensor):
        return full
    mesh = like.device_mesh
    rank, world = mesh.get_local_rank(), mesh.size()
    chunks = torch.chunk(full, world, dim=0)
    local = chunks[rank] if rank < len(chunks) else full[:0]
    if tuple(local.shape) != tuple(like.to_local().shape):
        raise QuantrollError(f"a saved tensor of shape {list(full.shape)} does not split into this rank's shard "
                             f"{list(like.to_local().shape)}; resume with the same model")
    return local


def gather_like(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The full tensor whose shards are every rank's ``local``, sharded as ``like`` is."""
    from torch.distributed.tensor import DTensor

    if not isinstance(like, DTensor):
        return local
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                              stride=like.stride()).full_tensor()

"""AdamW on FP32 master weights for a policy sharded by FSDP2.

The step of quantroll/trainer/optimizer.py (inherited, not restated), on this rank's shards: the FP32
masters and both moments are copies of the local shards only (so optimizer memory is
divided by the world size), each micro-batch's reduce-scattered gradient is summed in
FP32, the gradient norm is the square root of the sum over ranks of the local sums of
squares, a parameter no rank's forward used is skipped as one process skips it, and
the update is written back rounded to BF16 into the local shard. A save writes each
rank's shards (``export_local``; quantroll/rl/state_shards.py), and a state saved by N
ranks resumes on any number (``load_state_dict`` takes whole tensors and keeps its part).
"""

from __future__ import annotations

import torch

from quantroll.distributed.collectives import all_sum
from quantroll.distributed.context import DistContext
from quantroll.distributed.fsdp import gather_like, local_shard
from quantroll.trainer.optimizer import MasterWeightAdamW


class ShardedMasterAdamW(MasterWeightAdamW):
    """MasterWeightAdamW's step on this rank's shards; what sharding changes, and only that."""

    # load_state: the masters carry the trained values; the parameters are written from them
    writes_params_on_load = True

    def __init__(self, model: torch.nn.Module, lr: float, ctx: DistContext, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, weight_dtype: torch.dtype | None = torch.bfloat16):
        """``model``: the sharded policy (its parameters, and forward hooks that see which
        parameters a training forward used)."""
        self.ctx = ctx
        params = [p for p in model.parameters() if p.requires_grad]  # DTensors: global shapes, for loading
        self._marks = [False] * len(params)
        index = {id(p): i for i, p in enumerate(params)}
        for module in model.modules():
            mine = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
            if mine:
                module.register_forward_pre_hook(self._marker(mine))
        self._local = [p.to_local().detach() for p in params]  # views of this rank's shards
        self._build(params, self._local, lr, betas, eps, weight_decay, weight_dtype)

    def _local_grad(self, p: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the reduce-scattered gradient, copied (FSDP2 owns the original)."""
        return p.grad.to_local().to(torch.float32, copy=True)

    def _global_sum(self, local: float) -> float:
        return all_sum(self.ctx, [local])[0]

    def _marker(self, indices: list[int]):
        def mark(module, args) -> None:
            if torch.is_grad_enabled():
                for i in indices:
                    self._marks[i] = True
        return mark

    def zero_grad(self) -> None:
        super().zero_grad()
        self._marks = [False] * len(self.params)

    def _used(self, grads: list[torch.Tensor | None]) -> list[bool]:
        """Which parameters a training forward used on some rank since ``zero_grad``. One
        process leaves an unused parameter (an expert no token chose) without gradient, and
        AdamW then skips it (no moment decay, no step), while a used one with a zero gradient
        (a minibatch of zero advantages) steps on its momentum; FSDP2 hands both over as
        zeros (it must reduce-scatter every parameter, or the ranks' collectives would
        differ), so use is read from forward hooks instead, and agreed between ranks."""
        local = [float(m) for m in self._marks]
        self._marks = [False] * len(self.params)
        return [v > 0 for v in all_sum(self.ctx, local)] if local else []

    def export(self) -> tuple[list[torch.Tensor], dict]:
        """Whole tensors, gathered from every rank (a collective: every rank calls it)."""
        masters = [gather_like(m, p) for m, p in zip(self.master, self.params)]
        inner = self.inner.state_dict()
        state = {}
        for index, entry in inner["state"].items():
            p = self.params[index]
            state[index] = {k: (gather_like(v, p) if isinstance(v, torch.Tensor) and v.dim() else v)
                            for k, v in entry.items()}
        return masters, {"state": state, "param_groups": inner["param_groups"]}

    def export_local(self) -> tuple[list[torch.Tensor], dict]:
        """This rank's shards as they are, no collective (a sharded save, rl/state_shards.py)."""
        return MasterWeightAdamW.export(self)

    def load_local_state_dict(self, state: dict) -> None:
        """This rank's own shards in (a sharded save resumed on as many ranks)."""
        self._load_into(self._local, state)

    def state_dict(self) -> dict:
        masters, inner = self.export()
        return {"master": masters, "inner": inner}

    def load_state_dict(self, state: dict) -> None:
        """Whole tensors in (as a save holds them); this rank keeps its shards."""
        inner = state["inner"]
        local_state = {}
        for index, entry in inner["state"].items():
            p = self.params[int(index)]
            local_state[int(index)] = {k: (local_shard(v, p).clone() if isinstance(v, torch.Tensor) and v.dim() else v)
                                       for k, v in entry.items()}
        masters = [local_shard(saved, p) for saved, p in zip(state["master"], self.params)]
        self._load_into(self._local, {"master": masters,
                                      "inner": {"state": local_state, "param_groups": inner["param_groups"]}})

"""Where the trainer and the engine run: in this process (``OneProcess``), or as ranks of
a multi-process run (quantroll/distributed/placement.py). The RL loop asks its placement for
each piece it builds and each step that crosses processes, so the loop reads the same
either way and a one-process run is exactly what it was before ranks existed.
"""

from __future__ import annotations

import copy

from quantroll.sync import WeightSync
from quantroll.trainer.optimizer import MasterWeightAdamW


class OneProcess:
    writes = True  # this process writes the metrics, saves and exports
    rows = None  # train_on_batch's default: every row is ours
    label = "one process"

    def ref_policy(self, policy):
        return copy.deepcopy(policy).eval()

    def shard(self, policy) -> None:
        return None

    def optimizer(self, policy, lr: float) -> MasterWeightAdamW:
        return MasterWeightAdamW(policy.parameters(), lr=lr)

    def engine_device(self, device: str) -> str:
        """Where the trainer's process holds its engine: here, the engine it samples from."""
        return device

    def engines(self, engine):
        return engine

    def sync(self, engine, policy):
        """A callable that pushes the policy's current weights into the engine."""
        sync = WeightSync(engine)
        return lambda: sync.push({n: p for n, p in policy.named_parameters()})

    def check_weight_update(self, engine, push, allow_quant_error: bool) -> float:
        """--check-weight-update-equal: the worst error (0.0: bitwise); raises on a mismatch."""
        from quantroll.sync import check_weight_update

        return max(check_weight_update(engine, push, allow_quant_error).values(), default=0.0)

    def agree(self, fn):
        return fn()

    def exportable(self, policy, trainer_dir, dtype):
        return policy

    def stage(self, name: str, step: int | None = None):
        import contextlib

        return contextlib.nullcontext()

"""The RL loop's pieces as ranks of a multi-process run (colocated: every rank holds one
trainer shard and one whole engine on its device, as Miles' ``--colocate`` places them).

- the policy: FSDP2, ``fully_shard`` per decoder layer (quantroll/dist/fsdp.py);
- the optimizer: FP32 masters and moments of this rank's shards (dist/optimizer.py);
- the engines: data-parallel, one per rank (dist/data_parallel.py);
- the sync: unshard layer by layer, quantize on rank 0, broadcast (dist/weight_broadcast.py);
- the rows each rank trains on (dist/trainer_rows.py);
- failures: a rank's refusal reaches every rank (``agree``), and a collective that fails
  because a rank died names that rank (``stage`` and dist/liveness.py).
"""

from __future__ import annotations

import contextlib

import torch

from quantroll.dist.collectives import agree
from quantroll.dist.context import DistContext
from quantroll.dist.data_parallel import DataParallelEngines
from quantroll.dist.fsdp import full_tensor, shard_policy
from quantroll.dist.liveness import Stopped
from quantroll.dist.optimizer import ShardedMasterAdamW
from quantroll.dist.trainer_rows import RankRows
from quantroll.dist.weight_broadcast import BroadcastWeightSync
from quantroll.errors import QuantrollError


class RankFailure(QuantrollError):
    """A rank died or stopped answering: the run stops (exit status 1, not a user error)."""

    exit_code = 1


class Ranks:
    def __init__(self, ctx: DistContext, store=None, bucket_bytes: int | None = None):
        self.ctx, self.store, self.bucket_bytes = ctx, store, bucket_bytes
        self.writes = ctx.is_source
        self.rows = RankRows(ctx)
        self.units: dict[int, list] = {}
        self.label = f"rank {ctx.rank} of {ctx.world_size} ({ctx.backend})"

    def ref_policy(self, policy):
        import copy

        ref = copy.deepcopy(policy).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def shard(self, policy) -> None:
        self.units[id(policy)] = shard_policy(policy)

    def optimizer(self, policy, lr: float) -> ShardedMasterAdamW:
        return ShardedMasterAdamW(policy, lr=lr, ctx=self.ctx)

    def engines(self, engine):
        return DataParallelEngines(engine, self.ctx)

    def sync(self, engine, policy):
        kwargs = {} if self.bucket_bytes is None else {"bucket_bytes": self.bucket_bytes}
        sync = BroadcastWeightSync(engine, policy, self.units[id(policy)], self.ctx, **kwargs)
        return sync.push

    def agree(self, fn):
        return agree(self.ctx, fn)

    def exportable(self, policy, trainer_dir, dtype):
        """An unsharded copy of the policy on the writing rank (None elsewhere); every rank
        takes part in gathering it."""
        whole = {n: full_tensor(p.detach()) for n, p in policy.named_parameters()}
        if not self.writes:
            return None
        from quantroll.trainer.policy import load_policy

        copy = load_policy(trainer_dir, device="cpu", dtype=dtype)
        with torch.no_grad():
            for n, p in copy.named_parameters():
                p.copy_(whole[n])
        return copy

    @contextlib.contextmanager
    def stage(self, name: str, step: int | None = None):
        """Turn a collective that fails because a peer died into one line naming that peer."""
        where = name if step is None else f"{name} of step {step}"
        try:
            yield
        except QuantrollError:
            raise
        except (RuntimeError, Stopped) as err:  # gloo/NCCL errors (DistBackendError is one), the launcher's stop
            if self.store is None or not (isinstance(err, Stopped) or _looks_like_peer_loss(err)):
                raise
            raise self.failure(where) from None

    def failure(self, where: str) -> RankFailure:
        from quantroll.dist.liveness import describe_failure

        return RankFailure(f"{describe_failure(self.store, self.ctx.world_size, self.ctx.rank, where)}; the run is "
                           "stopped: resume it with --load from the last save")


def _looks_like_peer_loss(err: BaseException) -> bool:
    text = str(err).lower()
    return any(s in text for s in ("connection reset", "connection closed", "broken pipe", "nccl", "timed out",
                                   "peer", "socket", "gloo"))

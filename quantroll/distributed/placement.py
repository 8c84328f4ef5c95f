"""The RL loop's pieces as ranks of a multi-process run, in either of Miles' placements
(quantroll/distributed/groups.py): colocated (``--colocate``: every rank holds one trainer shard
and one whole engine on its device), or engines on ranks of their own (``--rollout-num-gpus
R``: the loop runs on the trainer ranks, the engine ranks serve its requests,
distributed/engine_ranks.py).

- the policy: FSDP2 over the trainer ranks, ``fully_shard`` per decoder layer (distributed/fsdp.py);
- the optimizer: FP32 masters and moments of this rank's shards (distributed/optimizer.py);
- the engines: data-parallel, one per engine rank (distributed/data_parallel.py; from a trainer
  rank of its own, ``RemoteEngines``);
- the sync: unshard layer by layer, quantize on rank 0, broadcast to every engine
  (distributed/weight_broadcast.py);
- the rows each trainer rank trains on (distributed/trainer_rows.py);
- failures: a rank's refusal reaches every rank (``agree``), and a collective that fails
  because a rank died names that rank (``stage`` and distributed/liveness.py).
"""

from __future__ import annotations

import contextlib

import torch

from quantroll.distributed.collectives import PeerFailed, agree, all_max
from quantroll.distributed.context import DistContext
from quantroll.distributed.data_parallel import DataParallelEngines
from quantroll.distributed.engine_ranks import EngineRequests, EngineServer, describe_engines
from quantroll.distributed.fsdp import full_tensor, shard_policy
from quantroll.distributed.groups import RankGroups
from quantroll.distributed.liveness import Stopped
from quantroll.distributed.optimizer import ShardedMasterAdamW
from quantroll.distributed.trainer_rows import RankRows
from quantroll.distributed.weight_broadcast import BroadcastWeightSync
from quantroll.errors import QuantrollError


class RankFailure(QuantrollError):
    """A rank died or stopped answering: the run stops (exit status 1, not a user error)."""

    exit_code = 1


class Ranks:
    """``groups``: the run's process groups (RankGroups.of(ctx), a collective; built here
    when not given)."""

    def __init__(self, ctx: DistContext, store=None, bucket_bytes: int | None = None,
                 groups: RankGroups | None = None):
        self.ctx, self.store, self.bucket_bytes = ctx, store, bucket_bytes
        self.groups = groups or RankGroups.of(ctx)
        self.requests = EngineRequests(self.groups)
        self.writes = ctx.is_source
        trainers = self.groups.trainers
        self.rows = RankRows(trainers) if trainers is not None else None
        self.units: dict[int, list] = {}
        self.label = f"rank {ctx.rank} of {ctx.world_size} ({ctx.backend}, {self.groups.role})"

    def ref_policy(self, policy):
        import copy

        ref = copy.deepcopy(policy).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def shard(self, policy) -> None:
        self.units[id(policy)] = shard_policy(policy, self.groups.trainers)

    def optimizer(self, policy, lr: float) -> ShardedMasterAdamW:
        return ShardedMasterAdamW(policy, lr=lr, ctx=self.groups.trainers)

    def engine_device(self, device: str) -> str:
        """Where a trainer rank holds its engine: on its device where it samples (colocated);
        with engines on ranks of their own, on the meta device: a description (format,
        layout) that takes no memory (the broadcast's source quantizes on its own device)."""
        return device if self.groups.colocated else "meta"

    def engines(self, engine):
        if self.groups.colocated:
            return DataParallelEngines(engine, self.ctx)
        return describe_engines(engine, self.groups, self.requests)

    def sync(self, engine, policy):
        """A callable that pushes the policy's weights into every engine (every trainer rank
        calls it together; the engine ranks serve it)."""
        kwargs = {} if self.bucket_bytes is None else {"bucket_bytes": self.bucket_bytes}
        units = self.units[id(policy)]
        if self.groups.colocated:
            sync = BroadcastWeightSync(engine, policy, units, self.ctx, **kwargs)
            sync.check_layout()
            return sync.push
        sync = BroadcastWeightSync(engine, policy, units, self.groups.broadcast, loads=False,
                                   trainers=self.groups.trainers if self.groups.trainers.world_size > 1 else None,
                                   **kwargs)
        self.requests.send("sync", units=[list(u.names) for u in units], bucket_bytes=sync.bucket_bytes)
        sync.check_layout()

        def push():
            self.requests.send("update")
            return sync.push()
        return push

    def serve(self, engine) -> None:
        """An engine rank's part of the run: serve the trainer ranks' requests until the end."""
        EngineServer(engine, self.groups, self.stage).serve()

    def check_weight_update(self, engine, push, allow_quant_error: bool) -> float:
        """--check-weight-update-equal on every engine: the worst error over all of them
        (0.0: bitwise); a failure is raised on every rank."""
        from quantroll.sync import check_weight_update

        if self.groups.colocated:
            errors = agree(self.ctx, lambda: check_weight_update(engine, push, allow_quant_error))
            return all_max(self.ctx, [max(errors.values(), default=0.0)])[0]
        self.requests.send("check", allow_quant_error=allow_quant_error)
        try:
            agree(self.ctx, push)  # the engine ranks check this update, inside the same agreement
        except PeerFailed as err:
            if self.ctx.is_source:  # an engine rank's failure, said once, here
                raise QuantrollError(str(err)) from None
            raise
        return all_max(self.ctx, [0.0])[0]

    def agree(self, fn):
        """``fn`` on every trainer rank (the loop's own checks; the engine ranks are serving)."""
        return agree(self.groups.trainers, fn)

    def agree_all(self, fn):
        """``fn`` on every rank of the world (the checks before the run)."""
        return agree(self.ctx, fn)

    def release_engines(self, failure: BaseException | None) -> None:
        """Trainer rank 0 ends the engine ranks' serving: after the run, or after a failure
        every trainer rank met (not after a rank's death: the engines learn of it themselves)."""
        if self.groups.colocated or not self.ctx.is_source:
            return
        if failure is None:
            self.requests.send("stop")
        elif isinstance(failure, QuantrollError) and not isinstance(failure, RankFailure):
            self.requests.send("stop", error=str(failure) or type(failure).__name__)

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
        from quantroll.distributed.liveness import describe_failure

        return RankFailure(f"{describe_failure(self.store, self.ctx.world_size, self.ctx.rank, where)}; the run is "
                           "stopped: resume it with --load from the last save")


def _looks_like_peer_loss(err: BaseException) -> bool:
    text = str(err).lower()
    return any(s in text for s in ("connection reset", "connection closed", "broken pipe", "nccl", "timed out",
                                   "peer", "socket", "gloo"))

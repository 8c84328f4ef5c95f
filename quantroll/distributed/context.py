"""Who this process is in a multi-process run, read from the launcher's environment.

torchrun (and quantroll's Ray launcher, which sets the same variables) export RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; a process without them, or with a
world of one, is a one-process run and gets no context at all (``from_environ`` returns
None), so the one-process code paths never see a collective.

A context is also the view of one process group (``subgroup``): the trainer ranks, the
engine ranks, or trainer rank 0 with the engine ranks (quantroll/distributed/groups.py). Its
``rank`` and ``world_size`` are then within that group, so every collective written for
the world (quantroll/distributed/collectives.py) runs unchanged over any group.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

import torch

from quantroll.errors import QuantrollError

# A collective waits this long for a peer before failing. A dead peer's socket closes at
# once (gloo, NCCL report it in well under a second), so this bounds only a peer that
# hangs alive; rollouts of long responses must fit inside it.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
# With engines on ranks of their own a rank also waits a whole phase in a collective (an
# engine rank for trainer rank 0's next request while the trainer steps or saves, a trainer
# rank for the engines' results while they roll out): those groups wait this long. A dead
# peer still fails them at once, and the heartbeats name it (quantroll/distributed/liveness.py).
PHASE_TIMEOUT = timedelta(hours=24)
STORE_ENV = "QUANTROLL_STORE"  # host:port of a rendezvous store the launcher hosts (else MASTER_ADDR/PORT)


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo" (CPU) or "nccl" (CUDA)
    device: torch.device  # this rank's device: cuda:<local_rank> or cpu
    # the last ``engine_ranks`` ranks of the world hold an engine only (--rollout-num-gpus without
    # --colocate); 0: colocated, every rank one trainer shard and one engine
    engine_ranks: int = 0
    group: object | None = None  # the process group this context spans (None: the default group, every rank)
    members: tuple[int, ...] | None = None  # the group's global ranks, by group rank (None: every rank)

    @property
    def is_source(self) -> bool:
        """Rank 0 (of the group): writes the outputs, quantizes and broadcasts the weight updates."""
        return self.rank == 0

    def global_rank(self, rank: int) -> int:
        """The world's rank of this group's ``rank`` (what torch.distributed's ``src`` takes)."""
        return rank if self.members is None else self.members[rank]

    def subgroup(self, members: Sequence[int], timeout: timedelta = COLLECTIVE_TIMEOUT) -> DistContext | None:
        """The context of the group of ``members`` (global ranks, in order), or None on a rank
        outside it; its collectives wait ``timeout`` for a peer. Collective: every rank of the
        world calls it, with the same members."""
        import torch.distributed as dist

        members = tuple(members)
        group = dist.new_group(list(members), timeout=timeout)
        if self.rank not in members:
            return None
        return replace(self, rank=members.index(self.rank), world_size=len(members), group=group, members=members)


def _int_env(name: str) -> int:
    value = os.environ.get(name, "")
    if not value.isdigit():
        raise QuantrollError(f"the launcher set {name}={value!r}, not a non-negative integer; start the ranks with "
                             "torchrun (or quantroll's --actor-num-* flags)")
    return int(value)


def from_environ(device: str, engine_ranks: int = 0) -> DistContext | None:
    """The context of this rank, or None for a one-process run. ``device`` is the
    --device flag: "cuda" (or cuda:N) becomes this rank's cuda:<LOCAL_RANK>.
    ``engine_ranks``: how many of the world's last ranks hold an engine only (0: colocated)."""
    if "WORLD_SIZE" not in os.environ or _int_env("WORLD_SIZE") <= 1:
        if engine_ranks:
            raise QuantrollError(f"--rollout-num-gpus {engine_ranks} without --colocate puts the engines on ranks of "
                                 "their own, beside at least one trainer rank: start it with torchrun "
                                 f"--nproc-per-node {engine_ranks + 1} (or more) or with --actor-num-gpus-per-node")
        return None
    world, rank = _int_env("WORLD_SIZE"), _int_env("RANK")
    local = _int_env("LOCAL_RANK") if "LOCAL_RANK" in os.environ else rank
    if not 0 <= rank < world:
        raise QuantrollError(f"RANK={rank} is outside WORLD_SIZE={world}; check the launcher's settings")
    if not 0 <= engine_ranks < world:
        raise QuantrollError(f"--rollout-num-gpus {engine_ranks} leaves no trainer rank among the {world} ranks: "
                             f"give at most {world - 1} (the rest train), or add --colocate")
    kind = torch.device(device).type
    if kind == "cuda":
        count = torch.cuda.device_count()
        if local >= count:
            raise QuantrollError(f"rank {rank} is local rank {local} but this machine has {count} CUDA device(s): "
                                 "start at most one rank per GPU (NCCL refuses two ranks on one GPU)")
        return DistContext(rank, world, local, "nccl", torch.device("cuda", local), engine_ranks)
    if kind != "cpu":
        raise QuantrollError(f"--device {device}: multi-process runs take cpu or cuda")
    return DistContext(rank, world, local, "gloo", torch.device("cpu"), engine_ranks)


def init_process_group(ctx: DistContext) -> None:
    """Join the default process group (idempotent)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    kwargs = {}
    if STORE_ENV in os.environ:  # a store hosted by the launcher (quantroll's Ray driver), outliving every rank
        host, _, port = os.environ[STORE_ENV].rpartition(":")
        kwargs["store"] = dist.PrefixStore("quantroll", dist.TCPStore(host, int(port), ctx.world_size, is_master=False,
                                                                       timeout=COLLECTIVE_TIMEOUT))
    dist.init_process_group(ctx.backend, rank=ctx.rank, world_size=ctx.world_size, timeout=COLLECTIVE_TIMEOUT,
                            device_id=ctx.device if ctx.device.type == "cuda" else None, **kwargs)


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()

"""Who this process is in a multi-process run, read from the launcher's environment.

torchrun (and quantroll's Ray launcher, which sets the same variables) export RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; a process without them, or with a
world of one, is a one-process run and gets no context at all (``from_environ`` returns
None), so the one-process code paths never see a collective.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from quantroll.errors import QuantrollError

# A collective waits this long for a peer before failing. A dead peer's socket closes at
# once (gloo, NCCL report it in well under a second), so this bounds only a peer that
# hangs alive; rollouts of long responses must fit inside it.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
STORE_ENV = "QUANTROLL_STORE"  # host:port of a rendezvous store the launcher hosts (else MASTER_ADDR/PORT)


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo" (CPU) or "nccl" (CUDA)
    device: torch.device  # this rank's device: cuda:<local_rank> or cpu

    @property
    def is_source(self) -> bool:
        """Rank 0: writes the outputs, quantizes and broadcasts the weight updates."""
        return self.rank == 0


def _int_env(name: str) -> int:
    value = os.environ.get(name, "")
    if not value.isdigit():
        raise QuantrollError(f"the launcher set {name}={value!r}, not a non-negative integer; start the ranks with "
                             "torchrun (or quantroll's --actor-num-* flags)")
    return int(value)


def from_environ(device: str) -> DistContext | None:
    """The context of this rank, or None for a one-process run. ``device`` is the
    --device flag: "cuda" (or cuda:N) becomes this rank's cuda:<LOCAL_RANK>."""
    if "WORLD_SIZE" not in os.environ or _int_env("WORLD_SIZE") <= 1:
        return None
    world, rank = _int_env("WORLD_SIZE"), _int_env("RANK")
    local = _int_env("LOCAL_RANK") if "LOCAL_RANK" in os.environ else rank
    if not 0 <= rank < world:
        raise QuantrollError(f"RANK={rank} is outside WORLD_SIZE={world}; check the launcher's settings")
    kind = torch.device(device).type
    if kind == "cuda":
        count = torch.cuda.device_count()
        if local >= count:
            raise QuantrollError(f"rank {rank} is local rank {local} but this machine has {count} CUDA device(s): "
                                 "start at most one rank per GPU (NCCL refuses two ranks on one GPU)")
        return DistContext(rank, world, local, "nccl", torch.device("cuda", local))
    if kind != "cpu":
        raise QuantrollError(f"--device {device}: multi-process runs take cpu or cuda")
    return DistContext(rank, world, local, "gloo", torch.device("cpu"))


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

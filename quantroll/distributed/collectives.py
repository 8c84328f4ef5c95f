"""The few collectives quantroll needs beyond FSDP2's own, on plain tensors (no pickle:
what crosses between ranks is tensors and UTF-8 text, as in every file quantroll reads).

Every function here must be called by every rank of the group, in the same order. The
group is the context's (``ctx.group``: the world, or the trainer or engine ranks alone,
quantroll/distributed/groups.py); a ``src`` is a rank within it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.distributed.context import DistContext

T = TypeVar("T")
# torch 2.13 renamed all_gather_into_tensor (deprecated there); torch 2.11 has only the old name
_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class PeerFailed(QuantrollError):
    """Another rank failed with a one-line error; it prints the line, this rank stays quiet
    (``quiet``) so that a failure is said once, not once per rank."""

    quiet = True


def broadcast(ctx: DistContext, tensor: torch.Tensor, src: int = 0) -> None:
    """torch.distributed.broadcast over the context's group, in place."""
    dist.broadcast(tensor, ctx.global_rank(src), group=ctx.group)


def broadcast_tensor(ctx: DistContext, tensor: torch.Tensor | None, dtype: torch.dtype, src: int = 0) -> torch.Tensor:
    """A 1-D tensor of ``dtype`` from rank ``src`` (``tensor`` ignored elsewhere), any length, on the CPU."""
    data = tensor.reshape(-1).to(ctx.device, dtype) if ctx.rank == src else None
    n = torch.tensor([data.numel() if data is not None else 0], dtype=torch.int64, device=ctx.device)
    broadcast(ctx, n, src)
    if data is None:
        data = torch.empty(int(n.item()), dtype=dtype, device=ctx.device)
    if data.numel():
        broadcast(ctx, data, src)
    return data.cpu()


def all_gather_varlen(ctx: DistContext, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's 1-D tensor (lengths may differ, dtype must not), in rank order."""
    local = tensor.reshape(-1).to(ctx.device)
    sizes = torch.zeros(ctx.world_size, dtype=torch.int64, device=ctx.device)
    _gather_single(sizes, torch.tensor([local.numel()], dtype=torch.int64, device=ctx.device), group=ctx.group)
    sizes = sizes.tolist()
    width = max(sizes)
    padded = torch.zeros(width, dtype=local.dtype, device=ctx.device)
    padded[: local.numel()] = local
    out = torch.empty(ctx.world_size * width, dtype=local.dtype, device=ctx.device)
    _gather_single(out, padded, group=ctx.group)
    return [out[r * width: r * width + n].cpu() for r, n in enumerate(sizes)]


def all_gather_rows(ctx: DistContext, rows: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's rows in rank order (each rank the same shape)."""
    local = rows.contiguous().to(ctx.device)
    out = torch.empty((ctx.world_size * local.shape[0], *local.shape[1:]), dtype=local.dtype, device=ctx.device)
    _gather_single(out, local, group=ctx.group)
    return out.to(rows.device)


def all_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Elementwise sums over ranks, in float64."""
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, group=ctx.group)
    return t.tolist()


def all_max(ctx: DistContext, values: list[float]) -> list[float]:
    """Elementwise maxima over ranks, in float64."""
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return t.tolist()


def all_true(ctx: DistContext, flag: bool) -> bool:
    t = torch.tensor([0 if flag else 1], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t, group=ctx.group)
    return int(t.item()) == 0


def text_to_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8) if text else torch.zeros(0, dtype=torch.uint8)


def tensor_to_text(t: torch.Tensor) -> str:
    return bytes(t.cpu().tolist()).decode("utf-8")


def broadcast_text(ctx: DistContext, text: str | None, src: int = 0) -> str:
    """``text`` from rank ``src`` (ignored elsewhere) to every rank."""
    return tensor_to_text(broadcast_tensor(ctx, text_to_tensor(text or "") if ctx.rank == src else None, torch.uint8,
                                           src))


def agree(ctx: DistContext, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it raised a QuantrollError on any, raise on all: the
    first failing rank's own error there, PeerFailed (quiet) on the others (a rank that
    failed only with a PeerFailed is not the one that failed first). Without this a
    rank that refuses (a bad flag, a mismatched weight) leaves the others waiting in their
    next collective until the timeout."""
    result, failure = None, None
    try:
        result = fn()
    except QuantrollError as err:
        failure = err
    messages = all_gather_varlen(ctx, text_to_tensor("" if failure is None else f"{type(failure).__name__}\n{failure}"))
    failed = [(r, tensor_to_text(m)) for r, m in enumerate(messages) if m.numel()]
    if not failed:
        return result
    # a rank whose failure is PeerFailed only repeats another's (a verdict heard inside ``fn``):
    # the rank that failed on its own says it
    first, text = next(((r, m) for r, m in failed if not m.startswith(f"{PeerFailed.__name__}\n")), failed[0])
    if first == ctx.rank:
        raise failure
    kind, _, message = text.partition("\n")
    who = ctx.global_rank(first)  # the rank a user can find in the launcher's output, not its index in the group
    if kind == "NonFiniteError":
        raise NonFiniteError(f"rank {who}: {message}")
    raise PeerFailed(f"rank {who}: {message}")

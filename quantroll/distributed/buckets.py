"""How a weight update is laid out on the wire: pure functions over (name, dtype, shape).

Tensors are packed whole, in the order given, into byte buckets of at most ``limit``
bytes (a group of tensors larger than that gets a bucket of its own), each tensor starting at a
multiple of ``ALIGN`` bytes so that every receiver can view its bytes as the tensor's
dtype without a copy. Sender and receivers compute the same layout from the same
manifest, so only the bytes travel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

ALIGN = 16
DEFAULT_BUCKET_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Slot:
    """One tensor of an update: what it is and where its bytes lie in its bucket."""

    key: str  # "<name>" for a plain tensor, "<name>:<part>" for part of a quantized weight
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


@dataclass(frozen=True)
class Bucket:
    slots: tuple[Slot, ...]
    nbytes: int


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(groups: Sequence[Sequence[tuple[str, torch.dtype, tuple[int, ...]]]], limit: int = DEFAULT_BUCKET_BYTES
           ) -> list[Bucket]:
    """Buckets for ``groups`` of [(key, dtype, shape)], in order. A group (the codes and
    scales of one weight) is never split, so a receiver can load each bucket on its own."""
    if limit < ALIGN:
        raise ValueError(f"bucket limit {limit} is below the alignment {ALIGN}")
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    used = 0
    for group in groups:
        placed, end = [], _aligned(used)
        for key, dtype, shape in group:
            slot = Slot(key, dtype, tuple(shape), _aligned(end))
            placed.append(slot)
            end = slot.offset + slot.nbytes
        if slots and end > limit:  # start a new bucket with this group
            buckets.append(Bucket(tuple(slots), used))
            slots, placed, end = [], [], 0
            for key, dtype, shape in group:
                slot = Slot(key, dtype, tuple(shape), _aligned(end))
                placed.append(slot)
                end = slot.offset + slot.nbytes
        slots += placed
        used = end
    if slots:
        buckets.append(Bucket(tuple(slots), used))
    return buckets


def manifest(units: Sequence[Sequence[Bucket]]) -> list[str]:
    """One line per slot ("unit bucket key dtype shape offset"): what a receiver must agree
    on with the sender before any bytes travel."""
    return [f"{u} {b} {s.key} {str(s.dtype).removeprefix('torch.')} {list(s.shape)} {s.offset}"
            for u, buckets in enumerate(units) for b, bucket in enumerate(buckets) for s in bucket.slots]


def first_difference(mine: Sequence[str], theirs: Sequence[str]) -> str | None:
    """Where two manifests part (None: they are the same), in words."""
    for a, b in zip(mine, theirs):
        if a != b:
            return f"this rank lays out {a!r} where the source lays out {b!r}"
    if len(mine) != len(theirs):
        return f"this rank lays out {len(mine)} tensors, the source {len(theirs)}"
    return None


def pack_into(buffer: torch.Tensor, bucket: Bucket, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Copy the bucket's tensors into ``buffer`` (uint8, at least bucket.nbytes); returns
    the bucket's bytes (a view of ``buffer``)."""
    for slot in bucket.slots:
        t = tensors[slot.key]
        if t.dtype != slot.dtype or tuple(t.shape) != slot.shape:
            raise ValueError(f"{slot.key} is {t.dtype} {tuple(t.shape)}, the layout says {slot.dtype} {slot.shape}")
        buffer[slot.offset: slot.offset + slot.nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    return buffer[: bucket.nbytes]


def views(data: torch.Tensor, bucket: Bucket) -> dict[str, torch.Tensor]:
    """The bucket's tensors as views of its bytes (no copy)."""
    return {s.key: data[s.offset: s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in bucket.slots}

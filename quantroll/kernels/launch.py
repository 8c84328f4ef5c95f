"""Small helpers for choosing Triton launch shapes."""

from __future__ import annotations


def next_pow2(n: int, floor: int) -> int:
    """The smallest power of two >= n and >= floor (Triton block sizes)."""
    p = floor
    while p < n:
        p *= 2
    return p

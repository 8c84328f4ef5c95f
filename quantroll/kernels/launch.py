"""Small helpers for Triton launches: block shapes, and whether Triton's CPU interpreter runs them."""

from __future__ import annotations

import os


def interpreting() -> bool:
    """Whether Triton's CPU interpreter runs the kernels (TRITON_INTERPRET=1): the kernels then
    take CPU tensors, exact-arithmetic branches replace hardware approximations, and the
    CUDA-only kernels (cuda_jit) stand aside."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int, floor: int) -> int:
    """The smallest power of two >= n and >= floor (Triton block sizes)."""
    p = floor
    while p < n:
        p *= 2
    return p

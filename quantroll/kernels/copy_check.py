"""Copy BF16 tensors into their destinations and flag the non-finite ones, in one read
(copy_check_triton.py); the launches are capturable in a CUDA graph (no host sync)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

BLOCK = 8192


def copy_and_flag(srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], flags: torch.Tensor) -> None:
    """dst.copy_(src) for each pair, and flags[i] = 1 where srcs[i] holds NaN/Inf (flags
    int32 [len(srcs)], zeroed here first). Sources contiguous BF16, destinations of their
    shape (ValueError naming the pair otherwise); a destination that is not contiguous
    takes torch's copy and a separate check (a second read of that source)."""
    from quantroll.kernels.copy_check_triton import copy_flag_kernel

    if len(srcs) != len(dsts) or flags.numel() != len(srcs) or flags.dtype != torch.int32:
        raise ValueError("copy_and_flag: one destination and one int32 flag per source")
    flags.zero_()
    for i, (src, dst) in enumerate(zip(srcs, dsts)):
        if src.dtype != torch.bfloat16 or not src.is_contiguous() or src.shape != dst.shape:
            raise ValueError(f"copy_and_flag: pair {i} needs a contiguous BF16 source and a destination of its "
                             f"shape (got {src.dtype} {tuple(src.shape)} -> {dst.dtype} {tuple(dst.shape)})")
        n = src.numel()
        if not dst.is_contiguous():
            dst.copy_(src)
            flags[i] = (~torch.isfinite(src).all()).to(torch.int32)
        elif n:
            copy_flag_kernel[(-(-n // BLOCK),)](src, dst, flags[i:], n, BLOCK=BLOCK, num_warps=8)

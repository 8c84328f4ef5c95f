"""Copy BF16 tensors into their destinations and flag the non-finite ones, in one read
(copy_check_triton.py); the launches are capturable in a CUDA graph (no host sync).

A large tensor (an embedding, lm_head) takes a launch of its own; the many small ones (a
model's norm vectors: 112 on Qwen3-1.7B) share one launch through tables of their
addresses, so an update does not pay a launch per norm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BLOCK = 8192
SMALL = 4 * BLOCK  # elements: a tensor up to this size shares the one many-tensor launch


class CopyTables:
    """The address tables of the small pairs of one fixed list (built once: the launches of a
    captured graph read them, so the tensors they point at must not move)."""

    def __init__(self, srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], flag_index: Sequence[int]):
        device = srcs[0].device
        self.count = len(srcs)
        self.blocks = max(-(-s.numel() // BLOCK) for s in srcs)
        self.src = torch.tensor([s.data_ptr() for s in srcs], dtype=torch.int64, device=device)
        self.dst = torch.tensor([d.data_ptr() for d in dsts], dtype=torch.int64, device=device)
        self.sizes = torch.tensor([s.numel() for s in srcs], dtype=torch.int64, device=device)
        self.flag_index = torch.tensor(list(flag_index), dtype=torch.int32, device=device)
        self.keep = (list(srcs), list(dsts))  # the tables hold raw addresses: keep their tensors alive


def copy_and_flag(srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], flags: torch.Tensor,
                  tables: CopyTables | None = None) -> CopyTables | None:
    """dst.copy_(src) for each pair, and flags[i] = 1 where srcs[i] holds NaN/Inf (flags
    int32 [len(srcs)], zeroed here first). Sources contiguous BF16, destinations of their
    shape (ValueError naming the pair otherwise); a destination that is not contiguous
    takes torch's copy and a separate check (a second read of that source). Returns the
    small pairs' tables; pass them back on the next call of the same lists (a graph's
    capture does, so that it builds no tensor from host data)."""
    from quantroll.kernels.copy_check_triton import copy_flag_kernel, copy_flag_many_kernel

    if len(srcs) != len(dsts) or flags.numel() != len(srcs) or flags.dtype != torch.int32:
        raise ValueError("copy_and_flag: one destination and one int32 flag per source")
    flags.zero_()
    small = []
    for i, (src, dst) in enumerate(zip(srcs, dsts)):
        if src.dtype != torch.bfloat16 or not src.is_contiguous() or src.shape != dst.shape:
            raise ValueError(f"copy_and_flag: pair {i} needs a contiguous BF16 source and a destination of its "
                             f"shape (got {src.dtype} {tuple(src.shape)} -> {dst.dtype} {tuple(dst.shape)})")
        n = src.numel()
        if not dst.is_contiguous():
            dst.copy_(src)
            flags[i] = (~torch.isfinite(src).all()).to(torch.int32)
        elif dst.dtype == torch.bfloat16 and 0 < n <= SMALL:
            small.append(i)
        elif n:
            copy_flag_kernel[(-(-n // BLOCK),)](src, dst, flags[i:], n, BLOCK=BLOCK, num_warps=8)
    if not small:
        return None
    if tables is None:
        tables = CopyTables([srcs[i] for i in small], [dsts[i] for i in small], small)
    copy_flag_many_kernel[(tables.blocks, tables.count)](tables.src, tables.dst, tables.sizes, tables.flag_index,
                                                         flags, BLOCK=BLOCK, num_warps=8)
    return tables

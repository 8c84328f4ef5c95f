"""Device side of programmatic dependent launch (see pdl.py for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a kernel that prefetches nothing. PDL 1: release the next kernel
    (it may start and park), then wait until the previous one has finished; PDL 2: wait,
    then release (a parked chain is at most one kernel deep)."""
    if PDL == 1:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL == 2:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def pdl_wait_then_release(PDL: tl.constexpr):
    """After a GEMM's weight prefetch: wait for the previous kernel, then release the next."""
    if PDL != 0:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_rows_l2(row_ptrs, NROWS: tl.constexpr, NBYTES: tl.constexpr):
    """Ask L2 for NBYTES contiguous bytes from each of the NROWS pointers (16-byte aligned,
    NBYTES a multiple of 16): one bulk prefetch per row, nothing waits for it."""
    size = tl.full([NROWS], NBYTES, tl.int32)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; // dummy $0", "=r,l,r", [row_ptrs, size],
                              dtype=tl.int32, is_pure=False, pack=1)

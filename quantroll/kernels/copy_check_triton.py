"""One pass that copies BF16 tensors and flags the ones holding NaN or Inf.

The direct weight update (sync/direct.py) must copy the trainer's BF16 tensors into the
engine and refuse an update with a non-finite value. Checking with a norm first reads
every source twice; here each program copies its block and, only where the block holds a
non-finite value, raises the tensor's flag (an atomic on one address per bad block, none
on a good update). A BF16 value is non-finite exactly when its exponent bits are all ones:
(bits & 0x7FFF) >= 0x7F80.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def copy_flag_kernel(src_ptr, dst_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(src_ptr + offs, mask=ok, other=0.0)
    tl.store(dst_ptr + offs, x.to(dst_ptr.dtype.element_ty), mask=ok)
    magnitude = x.to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF
    bad = tl.max((magnitude >= 0x7F80).to(tl.int32), axis=0)
    if bad > 0:
        tl.atomic_max(flag_ptr, 1)


@triton.jit
def copy_flag_many_kernel(src_table_ptr, dst_table_ptr, sizes_ptr, flag_index_ptr, flag_ptr, BLOCK: tl.constexpr):
    """The same for many small tensors in one launch: program (b, t) copies block b of tensor
    t, whose addresses and length come from the tables (int64 addresses, int64 lengths, the
    int32 index of its flag)."""
    t = tl.program_id(1)
    n = tl.load(sizes_ptr + t)
    start = tl.program_id(0).to(tl.int64) * BLOCK
    if start < n:
        src = tl.load(src_table_ptr + t).to(tl.pointer_type(tl.bfloat16))
        dst = tl.load(dst_table_ptr + t).to(tl.pointer_type(tl.bfloat16))
        offs = start + tl.arange(0, BLOCK)
        ok = offs < n
        x = tl.load(src + offs, mask=ok, other=0.0)
        tl.store(dst + offs, x, mask=ok)
        magnitude = x.to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF
        bad = tl.max((magnitude >= 0x7F80).to(tl.int32), axis=0)
        if bad > 0:
            tl.atomic_max(flag_ptr + tl.load(flag_index_ptr + t), 1)

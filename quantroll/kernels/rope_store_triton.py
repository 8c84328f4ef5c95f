"""The decode store kernel for families without QK-norm (model/families/): rotary and the
key/value store at the tokens' slots from the fused q/k/v projection, in one launch.

The twin of ``paged_attention_triton.store_kv_kernel`` with the per-head RMSNorm left
out; q/k/v biases are already in ``qkv`` (the fused projection adds them). Rotary is
rounded after each op as PyTorch rounds ``x * cos + rotate_half(x) * sin`` in the model
dtype (model/rope.apply_rotary), so the stored keys are those bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantroll.kernels.paged_attention_triton import _store_head


@triton.jit
def _rope(x1, x2, c, s, OUT: tl.constexpr):
    h1 = x1.to(tl.float32)
    h2 = x2.to(tl.float32)
    y1 = ((h1 * c).to(OUT).to(tl.float32) + (-h2 * s).to(OUT).to(tl.float32)).to(OUT)
    y2 = ((h2 * c).to(OUT).to(tl.float32) + (h1 * s).to(OUT).to(tl.float32)).to(OUT)
    return y1, y2


@triton.jit
def rope_store_kv_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr,
                         s_t, s_ct, s_qt, s_qh, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                         FP8: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Program (token, head): q heads rotated into q; k heads rotated and stored at the
    token's slot, with the matching v head."""
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    offs = tl.arange(0, HALF)
    c = tl.load(cos_ptr + t * s_ct + offs).to(tl.float32)
    s = tl.load(sin_ptr + t * s_ct + offs).to(tl.float32)
    OUT = q_ptr.dtype.element_ty
    if head < HQ:
        base = qkv_ptr + t * s_t + head * D
        y1, y2 = _rope(tl.load(base + offs), tl.load(base + HALF + offs), c, s, OUT)
        tl.store(q_ptr + t * s_qt + head * s_qh + offs, y1)
        tl.store(q_ptr + t * s_qt + head * s_qh + HALF + offs, y2)
    else:
        kvh = head - HQ
        base = qkv_ptr + t * s_t + (HQ + kvh) * D
        y1, y2 = _rope(tl.load(base + offs), tl.load(base + HALF + offs), c, s, OUT)
        slot = tl.load(slot_ptr + t)
        _store_head(k_ptr, ks_ptr, slot, kvh, offs, y1, y2, HKV, D, FP8, BLOCK_SIZE, False)
        vbase = qkv_ptr + t * s_t + (HQ + HKV + kvh) * D
        _store_head(v_ptr, vs_ptr, slot, kvh, offs, tl.load(vbase + offs), tl.load(vbase + HALF + offs), HKV, D, FP8,
                    BLOCK_SIZE, FP8)

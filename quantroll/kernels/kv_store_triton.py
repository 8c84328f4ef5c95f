"""The decode step's key/value store into the paged KV cache (engine/paged_cache.py), in Triton.

``store_kv_kernel``: q/k RMSNorm (where the family has QK-norm), rotary and the key/value
store at the tokens' slots, from the fused q/k/v projection of a decode step (the decode
twin of the model's ops), quantizing keys and values for an FP8 cache (E4M3 codes, one
float32 scale per slot and head, at the pool layouts paged_attention_triton.py reads).
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantroll.kernels.fused_triton import FP32_TINY, _norm_rope, _rope
from quantroll.kernels.paged_attention_triton import _scale_index


@triton.jit
def _saturate_e4m3(c):
    """Codes in [-448, 448], a NaN as 0: no E4M3 NaN ever enters the pool (the value loads
    read past each sequence unmasked; see _load_values_positions_minor)."""
    return tl.minimum(tl.maximum(tl.where(c == c, c, 0.0), -448.0), 448.0)


@triton.jit
def _store_head(pool, scales, slot, kvh, offs, y1, y2, HKV: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr,
                BLOCK_SIZE: tl.constexpr, POSITIONS_MINOR: tl.constexpr):
    """Store one head's vector (its two halves) at ``slot``; FP8: as E4M3 codes with the
    vector's scale amax / 448 (formats/kv_fp8.quantize_kv). POSITIONS_MINOR: the pool is
    [num_blocks, HKV, D, BLOCK_SIZE] (an FP8 cache's values)."""
    HALF: tl.constexpr = D // 2
    if POSITIONS_MINOR:
        base = pool + ((slot // BLOCK_SIZE) * HKV + kvh) * (D * BLOCK_SIZE) + slot % BLOCK_SIZE
        step: tl.constexpr = BLOCK_SIZE
    else:
        base = pool + (slot * HKV + kvh) * D
        step: tl.constexpr = 1
    if FP8:
        a = tl.maximum(tl.max(tl.abs(y1.to(tl.float32)), axis=0), tl.max(tl.abs(y2.to(tl.float32)), axis=0))
        scale = tl.maximum(tl.math.div_rn(a, 448.0), FP32_TINY)
        scale = tl.where(a > 0, scale, 0.0)
        divisor = tl.where(scale > 0, scale, 1.0)
        c1 = _saturate_e4m3(tl.math.div_rn(y1.to(tl.float32), divisor))
        c2 = _saturate_e4m3(tl.math.div_rn(y2.to(tl.float32), divisor))
        tl.store(base + offs * step, c1.to(tl.float8e4nv))
        tl.store(base + (HALF + offs) * step, c2.to(tl.float8e4nv))
        tl.store(scales + _scale_index(slot, kvh, HKV, BLOCK_SIZE), scale)
    else:
        tl.store(base + offs * step, y1.to(pool.dtype.element_ty))
        tl.store(base + (HALF + offs) * step, y2.to(pool.dtype.element_ty))


@triton.jit
def store_kv_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, eps,
                    s_t, s_ct, s_qt, s_qh, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, QK_NORM: tl.constexpr):
    """Program (token, head): q heads normalized (QK_NORM: the family's per-head RMSNorm;
    else qw/kw are never read) and rotated into q; k heads normalized, rotated and stored at
    the token's slot, with the matching v head. q/k/v biases are already in qkv."""
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    offs = tl.arange(0, HALF)
    c = tl.load(cos_ptr + t * s_ct + offs).to(tl.float32)
    s = tl.load(sin_ptr + t * s_ct + offs).to(tl.float32)
    OUT = q_ptr.dtype.element_ty
    if head < HQ:
        base = qkv_ptr + t * s_t + head * D
        if QK_NORM:
            y1, y2 = _norm_rope(tl.load(base + offs), tl.load(base + HALF + offs), tl.load(qw_ptr + offs),
                                tl.load(qw_ptr + HALF + offs), c, s, eps, D, OUT)
        else:
            y1, y2 = _rope(tl.load(base + offs), tl.load(base + HALF + offs), c, s, OUT)
        tl.store(q_ptr + t * s_qt + head * s_qh + offs, y1)
        tl.store(q_ptr + t * s_qt + head * s_qh + HALF + offs, y2)
    else:
        kvh = head - HQ
        base = qkv_ptr + t * s_t + (HQ + kvh) * D
        if QK_NORM:
            y1, y2 = _norm_rope(tl.load(base + offs), tl.load(base + HALF + offs), tl.load(kw_ptr + offs),
                                tl.load(kw_ptr + HALF + offs), c, s, eps, D, OUT)
        else:
            y1, y2 = _rope(tl.load(base + offs), tl.load(base + HALF + offs), c, s, OUT)
        slot = tl.load(slot_ptr + t)
        _store_head(k_ptr, ks_ptr, slot, kvh, offs, y1, y2, HKV, D, FP8, BLOCK_SIZE, False)
        vbase = qkv_ptr + t * s_t + (HQ + HKV + kvh) * D
        _store_head(v_ptr, vs_ptr, slot, kvh, offs, tl.load(vbase + offs), tl.load(vbase + HALF + offs), HKV, D, FP8,
                    BLOCK_SIZE, FP8)

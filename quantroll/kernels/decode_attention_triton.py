"""Decode attention over a static KV cache, reading only each sequence's valid keys.

One program per (sequence, KV head) handles the whole group of query heads that share
that KV head (GQA), so every key and value is read once per step. Online softmax in
float32 (flash-decoding without the split), P cast to the value dtype for the PV dot.
The loop bound is read from device memory, so the kernel is CUDA-graph safe while
sequences grow.

``decode_attention_kernel`` attends with a q that ``qk_norm_rope_cache_kernel``
(fused_triton.py) prepared in a launch of its own; ``decode_attention_qkv_kernel`` does
both for the step's token in one launch (q/k norms, rotary, the k/v cache write, the
attention, and optionally the FP8 quantization of the output for a block-FP8 o_proj, the
codes ``act_quant_fp8_kernel`` makes of its BF16 output). It spells out the two launches'
reduction order (``_sum_squares``), which makes the two bit-identical under Triton 3.8's
interpreter; compiled, Triton's ordering and FMA contraction of the norm and rotary
arithmetic vary by version, so on the H200 (Triton 3.6) they differ in last bits.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from quantroll.kernels.fused_triton import _quant_fp8_groups


@triton.jit
def _attend_group(q, k_base, v_base, length, sm_scale, s_ks, s_vs, offs_d, d_ok,
                  G_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_S: tl.constexpr):
    """q [G_PAD, D_PAD] against keys/values 0..length-1 -> the float32 output rows (online
    softmax). Both kernels inline this one loop, so their attention arithmetic cannot
    drift apart."""
    m_i = tl.full((G_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((G_PAD,), dtype=tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), dtype=tl.float32)
    for s0 in range(0, length, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_ok = offs_s < length
        k = tl.load(k_base + offs_s[:, None] * s_ks + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        qk = tl.where(s_ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + offs_s[:, None] * s_vs + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc / l_i[:, None]


@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, sm_scale,
                            s_qb, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_ob, s_oh,
                            HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
                            BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    length = tl.load(len_ptr + b).to(tl.int32)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    g_ok = offs_g < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + offs_d[None, :], mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    out = _attend_group(q, k_ptr + b * s_kb + kvh * s_kh, v_ptr + b * s_vb + kvh * s_vh, length, sm_scale, s_ks, s_vs,
                        offs_d, d_ok, G_PAD, D_PAD, BLOCK_S)
    tl.store(o_ptr + b * s_ob + heads[:, None] * s_oh + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=g_ok[:, None] & d_ok[None, :])


# -- one launch from the fused q/k/v projection ------------------------------------------


@triton.jit
def _halve(x, R: tl.constexpr, N: tl.constexpr):
    """[R, N] -> [R, N/2]: x[:, j] + x[:, j + N/2]. A sum of two values is the same
    whichever operand comes first, so this step rounds the same under any layout."""
    return tl.sum(tl.reshape(x, [R, 2, N // 2]), axis=1)


@triton.jit
def _sum_squares(h, R: tl.constexpr, HALF: tl.constexpr):
    """Row sums of h*h for h [R, HALF] (HALF <= 64), in the order in which the compiled
    ``_norm_rope`` adds its [HALF] vector (one warp, checked in the PTX of Triton 3.8 for
    sm_90): each lane first adds its HALF/32 adjacent elements (two at HALF = 64, else
    one), then the lanes' values combine in a butterfly whose first step pairs lanes 16
    apart, i.e. by folding halves. A float32 sum depends on its order, and this kernel's
    [GROUP, HALF] tile would get another layout (and order) from a plain tl.sum, so the
    tree is spelled out in sums of two. Squares of bf16 values are exact in float32, so
    whether the compiler fuses a square into an add (FMA) changes nothing."""
    tl.static_assert(HALF <= 64, "the lane order is reproduced for head_dim <= 128 only")
    s = h * h
    if HALF == 64:  # two adjacent elements per lane
        s = tl.reshape(tl.sum(tl.reshape(s, [R, 32, 2]), axis=2), [R, 32])
    LANES: tl.constexpr = HALF if HALF < 32 else 32
    if LANES >= 32:
        s = _halve(s, R, 32)
    if LANES >= 16:
        s = _halve(s, R, 16)
    if LANES >= 8:
        s = _halve(s, R, 8)
    if LANES >= 4:
        s = _halve(s, R, 4)
    if LANES >= 2:
        s = _halve(s, R, 2)
    return tl.reshape(s, [R])


@triton.jit
def _norm_rope_rows(x1, x2, w1, w2, c, s, eps, R: tl.constexpr, D: tl.constexpr, OUT: tl.constexpr):
    """``_norm_rope`` (fused_triton.py) for R heads at once: x1, x2 [R, D/2] the halves
    of each head, w1, w2, c, s [D/2]. The same ops in the same order per element (so the
    compiler treats them alike), with the RMS sums in the reference's order (_sum_squares)."""
    h1 = x1.to(tl.float32)
    h2 = x2.to(tl.float32)
    var = (_sum_squares(h1, R, D // 2) + _sum_squares(h2, R, D // 2)) / D
    r = (1.0 / tl.sqrt(var + eps))[:, None]
    w1 = w1[None, :]
    w2 = w2[None, :]
    c = c[None, :]
    s = s[None, :]
    n1 = (w1.to(tl.float32) * (h1 * r).to(OUT).to(tl.float32)).to(OUT).to(tl.float32)
    n2 = (w2.to(tl.float32) * (h2 * r).to(OUT).to(tl.float32)).to(OUT).to(tl.float32)
    # x * cos + rotate_half(x) * sin, rounded after each op as PyTorch does in bf16
    y1 = ((n1 * c).to(OUT).to(tl.float32) + (-n2 * s).to(OUT).to(tl.float32)).to(OUT)
    y2 = ((n2 * c).to(OUT).to(tl.float32) + (n1 * s).to(OUT).to(tl.float32)).to(OUT)
    return y1, y2


@triton.jit
def _join_halves(y1, y2, R: tl.constexpr, D: tl.constexpr):
    """[R, D/2] first and second halves -> [R, D] rows."""
    return tl.reshape(tl.permute(tl.join(y1, y2), (0, 2, 1)), (R, D))


@triton.jit
def _cache_token_kv(qkv_row, kw_ptr, c, s, eps, kc_dst, vc_dst, kvh, HQ: tl.constexpr, HKV: tl.constexpr,
                    D: tl.constexpr, OUT: tl.constexpr):
    """Normalize and rotate the token's k head ``kvh`` and write it and its v head into
    the cache slots ``kc_dst`` / ``vc_dst``."""
    HALF: tl.constexpr = D // 2
    offs = tl.arange(0, HALF)[None, :]
    k_src = qkv_row + (HQ + kvh) * D
    y1, y2 = _norm_rope_rows(tl.load(k_src + offs), tl.load(k_src + HALF + offs), tl.load(kw_ptr + tl.arange(0, HALF)),
                             tl.load(kw_ptr + HALF + tl.arange(0, HALF)), c, s, eps, 1, D, OUT)
    tl.store(kc_dst + offs, y1)
    tl.store(kc_dst + HALF + offs, y2)
    offs_d = tl.arange(0, D)
    tl.store(vc_dst + offs_d, tl.load(qkv_row + (HQ + HKV + kvh) * D + offs_d))


@triton.jit
def decode_attention_qkv_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, row_ptr, pos_ptr,
                                o_ptr, oq_ptr, os_ptr, eps, sm_scale,
                                s_t, s_ct, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_ob, s_oh, s_oqb, s_osb, s_osg,
                                HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr,
                                G_PAD: tl.constexpr, BLOCK_S: tl.constexpr, QUANT: tl.constexpr,
                                RELEASE: tl.constexpr = False):
    """Program (sequence b, KV head kvh) for the token of b at positions[b]: what
    qk_norm_rope_cache_kernel does for its GROUP q heads and its k/v head, then what
    decode_attention_kernel does for them, over positions 0..positions[b]. QUANT: the
    output goes out as FP8 codes (oq) and 1x128 scales (os) of its BF16 values, one group
    per head (D == 128), instead of BF16 (o). RELEASE: let the next kernel (a decode GEMM
    launched early) launch now (fp8_gemv.release_producers)."""
    tl.static_assert(not QUANT or D == 128, "QUANT needs one 1x128 group per head")
    if RELEASE:
        gdc_launch_dependents()
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    OUT = qkv_ptr.dtype.element_ty
    offs_h = tl.arange(0, HALF)
    c = tl.load(cos_ptr + b * s_ct + offs_h).to(tl.float32)
    s = tl.load(sin_ptr + b * s_ct + offs_h).to(tl.float32)
    qkv_row = qkv_ptr + b * s_t
    pos = tl.load(pos_ptr + b)
    _cache_token_kv(qkv_row, kw_ptr, c, s, eps, kc_ptr + tl.load(row_ptr + b) * s_kb + pos * s_ks + kvh * s_kh,
                    vc_ptr + tl.load(row_ptr + b) * s_vb + pos * s_vs + kvh * s_vh, kvh, HQ, HKV, D, OUT)

    offs_g = tl.arange(0, G_PAD)
    g_ok = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q_src = qkv_row + heads[:, None] * D + offs_h[None, :]
    y1, y2 = _norm_rope_rows(tl.load(q_src, mask=g_ok[:, None], other=0.0),
                             tl.load(q_src + HALF, mask=g_ok[:, None], other=0.0),
                             tl.load(qw_ptr + offs_h), tl.load(qw_ptr + HALF + offs_h), c, s, eps, G_PAD, D, OUT)
    q = tl.where(g_ok[:, None], _join_halves(y1, y2, G_PAD, D), 0.0).to(OUT)  # padding rows 0, as the other kernel loads them

    # the k/v just stored are read back below by other threads of this program
    tl.debug_barrier()
    offs_d = tl.arange(0, D)
    d_ok = offs_d < D
    length = (pos + 1).to(tl.int32)
    k_base = kc_ptr + b * s_kb + kvh * s_kh
    v_base = vc_ptr + b * s_vb + kvh * s_vh
    out = _attend_group(q, k_base, v_base, length, sm_scale, s_ks, s_vs, offs_d, d_ok, G_PAD, D, BLOCK_S).to(OUT)
    _store_attention_output(out, b, heads, g_ok, offs_d, d_ok, o_ptr, oq_ptr, os_ptr, s_ob, s_oh, s_oqb, s_osb,
                            s_osg, G_PAD, D, QUANT)


@triton.jit
def _store_attention_output(out, b, heads, g_ok, offs_d, d_ok, o_ptr, oq_ptr, os_ptr, s_ob, s_oh, s_oqb, s_osb, s_osg,
                            G_PAD: tl.constexpr, D: tl.constexpr, QUANT: tl.constexpr):
    """The GROUP heads' BF16 output rows, or (QUANT) their FP8 codes and 1x128 scales."""
    if QUANT:
        codes, scales = _quant_fp8_groups(tl.reshape(out.to(tl.float32), [G_PAD * D]), G_PAD)
        tl.store(oq_ptr + b * s_oqb + heads[:, None] * D + offs_d[None, :], codes, mask=g_ok[:, None])
        tl.store(os_ptr + b * s_osb + heads * s_osg, scales, mask=g_ok)
    else:
        tl.store(o_ptr + b * s_ob + heads[:, None] * s_oh + offs_d[None, :], out, mask=g_ok[:, None] & d_ok[None, :])

"""Fused elementwise kernels for the GPU decode step (fewer launches per layer).

Each kernel reproduces the rounding steps of the PyTorch ops it replaces (bf16 results
after every op that PyTorch rounds), so the engine's numerics move only by reduction
order inside the RMS mean:

- ``add_rmsnorm``: residual = x + delta (rounded), y = weight * bf16(r * rsqrt(mean r^2 + eps))
- ``qk_norm_rope_cache``: for the token's q/k/v row of the fused projection: RMSNorm of
  each q and k head, rotary embedding (rotate-half form), k and v written into the KV
  cache at the token's position, q returned
- ``silu_mul``: bf16(silu(gate)) * up, rounded
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, res_ptr, y_ptr, H, eps, s_x, s_d, s_r, s_y,
                       HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    x = tl.load(x_ptr + row * s_x + offs, mask=ok, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + row * s_d + offs, mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_ptr + row * s_r + offs, x, mask=ok)
    h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / H
    n = (h * (1.0 / tl.sqrt(var + eps))).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    y = (w.to(tl.float32) * n.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * s_y + offs, y, mask=ok)


@triton.jit
def _norm_rope(x1, x2, w1, w2, c, s, eps, D: tl.constexpr, OUT: tl.constexpr):
    h1 = x1.to(tl.float32)
    h2 = x2.to(tl.float32)
    var = (tl.sum(h1 * h1, axis=0) + tl.sum(h2 * h2, axis=0)) / D
    r = 1.0 / tl.sqrt(var + eps)
    n1 = (w1.to(tl.float32) * (h1 * r).to(OUT).to(tl.float32)).to(OUT).to(tl.float32)
    n2 = (w2.to(tl.float32) * (h2 * r).to(OUT).to(tl.float32)).to(OUT).to(tl.float32)
    # x * cos + rotate_half(x) * sin, rounded after each op as PyTorch does in bf16
    y1 = ((n1 * c).to(OUT).to(tl.float32) + (-n2 * s).to(OUT).to(tl.float32)).to(OUT)
    y2 = ((n2 * c).to(OUT).to(tl.float32) + (n1 * s).to(OUT).to(tl.float32)).to(OUT)
    return y1, y2


@triton.jit
def qk_norm_rope_cache_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, row_ptr, pos_ptr, eps,
                              s_t, s_ct, s_qt, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh,
                              HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr):
    t = tl.program_id(0)
    head = tl.program_id(1)  # 0..HQ-1: q heads; HQ..HQ+HKV-1: kv heads
    HALF: tl.constexpr = D // 2
    offs = tl.arange(0, HALF)
    c = tl.load(cos_ptr + t * s_ct + offs).to(tl.float32)
    s = tl.load(sin_ptr + t * s_ct + offs).to(tl.float32)
    OUT = q_ptr.dtype.element_ty
    if head < HQ:
        base = qkv_ptr + t * s_t + head * D
        y1, y2 = _norm_rope(tl.load(base + offs), tl.load(base + HALF + offs), tl.load(qw_ptr + offs),
                            tl.load(qw_ptr + HALF + offs), c, s, eps, D, OUT)
        tl.store(q_ptr + t * s_qt + head * s_qh + offs, y1)
        tl.store(q_ptr + t * s_qt + head * s_qh + HALF + offs, y2)
    else:
        kvh = head - HQ
        base = qkv_ptr + t * s_t + (HQ + kvh) * D
        y1, y2 = _norm_rope(tl.load(base + offs), tl.load(base + HALF + offs), tl.load(kw_ptr + offs),
                            tl.load(kw_ptr + HALF + offs), c, s, eps, D, OUT)
        b = tl.load(row_ptr + t)
        p = tl.load(pos_ptr + t)
        k_dst = kc_ptr + b * s_kb + p * s_ks + kvh * s_kh
        tl.store(k_dst + offs, y1)
        tl.store(k_dst + HALF + offs, y2)
        vbase = qkv_ptr + t * s_t + (HQ + HKV + kvh) * D
        v_dst = vc_ptr + b * s_vb + p * s_vs + kvh * s_vh
        tl.store(v_dst + offs, tl.load(vbase + offs))
        tl.store(v_dst + HALF + offs, tl.load(vbase + HALF + offs))


@triton.jit
def silu_mul_kernel(gu_ptr, y_ptr, I, s_g, s_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < I
    g = tl.load(gu_ptr + row * s_g + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_g + I + offs, mask=ok, other=0.0)
    act = (g / (1.0 + tl.exp(-g))).to(u.dtype)
    tl.store(y_ptr + row * s_y + offs, (act.to(tl.float32) * u.to(tl.float32)).to(u.dtype), mask=ok)

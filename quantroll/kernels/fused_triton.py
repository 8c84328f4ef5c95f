"""Fused elementwise kernels for the GPU decode step (fewer launches per layer).

Each kernel reproduces the rounding steps of the PyTorch ops it replaces (bf16 results
after every op that PyTorch rounds), so the engine's numerics move only by reduction
order inside the RMS mean:

- ``add_rmsnorm``: residual = x + delta (rounded), y = weight * bf16(r * rsqrt(mean r^2 + eps))
- ``_norm_rope``: RMSNorm of one q or k head and its rotary embedding (rotate-half
  form), for the paged cache's store kernel (kv_store_triton.py)
- ``silu_mul``: bf16(silu(gate)) * up, rounded

``add_rmsnorm`` and ``silu_mul`` have a ``QUANT`` variant for when their output feeds a
block-FP8 linear: instead of the BF16 output they store its 1x128-group FP8 codes and
scales (``_store_fp8_groups``), bit-identical to what ``act_quant_fp8_kernel`` makes of
the BF16 output, so the linear skips its own quantization launch. The row length must
be a multiple of 128 (every group whole in one program).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

FP32_TINY = tl.constexpr(1.1754943508222875e-38)  # smallest normal float32, as in fp8_gemm_triton.py


@triton.jit
def _quant_fp8_groups(x, GROUPS: tl.constexpr):
    """x [GROUPS * 128] float32 -> (codes [GROUPS, 128] e4m3, scales [GROUPS] float32).

    Op for op the math of ``act_quant_fp8_kernel`` (fp8_gemm_triton.py), one group per
    row of the reshape: the two must stay identical, since an FP8 linear gets either
    one's output for the same activation (tests/engine/test_fused_quant.py compares the
    bits)."""
    x = tl.reshape(x, [GROUPS, 128])
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.maximum(tl.math.div_rn(amax, 448.0), FP32_TINY)
    scale = tl.where(amax > 0, scale, 0.0)
    divisor = tl.where(scale > 0, scale, 1.0)
    q = tl.math.div_rn(x, divisor[:, None])
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    return q.to(tl.float8e4nv), scale


@triton.jit
def _store_fp8_groups(y, ok, q_row_ptr, s_row_ptr, s_sg, g0, n_groups, BLOCK: tl.constexpr):
    """Quantize ``y``, BLOCK consecutive values of a row from group ``g0`` on (``ok`` where
    they exist); store their codes at ``q_row_ptr`` + their column, and the scales of the
    groups below ``n_groups`` at ``s_row_ptr + g * s_sg``. The caller's block starts on a
    group boundary and the row length is a multiple of 128, so no group is split."""
    GROUPS: tl.constexpr = BLOCK // 128
    codes, scales = _quant_fp8_groups(tl.where(ok, y.to(tl.float32), 0.0), GROUPS)
    g = g0 + tl.arange(0, GROUPS)
    cols = g[:, None] * 128 + tl.arange(0, 128)[None, :]
    g_ok = g < n_groups
    tl.store(q_row_ptr + cols, codes, mask=g_ok[:, None])
    tl.store(s_row_ptr + g * s_sg, scales, mask=g_ok)


@triton.jit
def add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, res_ptr, y_ptr, q_ptr, s_ptr, H, eps, s_x, s_d, s_r, s_y, s_q, s_sm, s_sg,
                       HAS_DELTA: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr,
                       STORE_Y: tl.constexpr = True, RELEASE: tl.constexpr = False):
    """One row per program. QUANT: y also goes out as FP8 codes (q) and scales (s); STORE_Y:
    y goes out in BF16 (both: a MoE block routes on the BF16 values, its experts read
    the codes). RELEASE: let the next kernel (a decode GEMM launched early) launch now
    (fp8_gemv.release_producers)."""
    if RELEASE:
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)  # row x stride passes 2^31 on long prefills
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
    y = (w.to(tl.float32) * n.to(tl.float32)).to(x_ptr.dtype.element_ty)
    if QUANT:
        _store_fp8_groups(y, ok, q_ptr + row * s_q, s_ptr + row * s_sm, s_sg, 0, H // 128, BLOCK)
    if STORE_Y:
        tl.store(y_ptr + row * s_y + offs, y, mask=ok)


@triton.jit
def _norm_rope(x1, x2, w1, w2, c, s, eps, D: tl.constexpr, OUT: tl.constexpr):
    h1 = x1.to(tl.float32)
    h2 = x2.to(tl.float32)
    var = (tl.sum(h1 * h1, axis=0) + tl.sum(h2 * h2, axis=0)) / D
    r = 1.0 / tl.sqrt(var + eps)
    n1 = (w1.to(tl.float32) * (h1 * r).to(OUT).to(tl.float32)).to(OUT)
    n2 = (w2.to(tl.float32) * (h2 * r).to(OUT).to(tl.float32)).to(OUT)
    return _rope(n1, n2, c, s, OUT)


@triton.jit
def _rope(x1, x2, c, s, OUT: tl.constexpr):
    """x * cos + rotate_half(x) * sin on a head's two halves, rounded after each op as
    PyTorch rounds it in the model dtype (model/rope.apply_rotary)."""
    h1 = x1.to(tl.float32)
    h2 = x2.to(tl.float32)
    y1 = ((h1 * c).to(OUT).to(tl.float32) + (-h2 * s).to(OUT).to(tl.float32)).to(OUT)
    y2 = ((h2 * c).to(OUT).to(tl.float32) + (h1 * s).to(OUT).to(tl.float32)).to(OUT)
    return y1, y2


@triton.jit
def silu_mul_kernel(gu_ptr, y_ptr, q_ptr, s_ptr, I, s_g, s_y, s_q, s_sm, s_sg, QUANT: tl.constexpr, BLOCK: tl.constexpr,
                    RELEASE: tl.constexpr = False):
    """Program (row, block of BLOCK outputs). QUANT: y goes out as FP8 codes (q) and scales
    (s) instead of BF16; BLOCK is then a multiple of 128 so that blocks hold whole groups.
    RELEASE: let the next kernel (a decode GEMM launched early) launch now
    (fp8_gemv.release_producers)."""
    if RELEASE:
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)  # row x stride passes 2^31 on long prefills
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < I
    g = tl.load(gu_ptr + row * s_g + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_g + I + offs, mask=ok, other=0.0)
    act = (g / (1.0 + tl.exp(-g))).to(u.dtype)
    y = (act.to(tl.float32) * u.to(tl.float32)).to(u.dtype)
    if QUANT:
        _store_fp8_groups(y, ok, q_ptr + row * s_q, s_ptr + row * s_sm, s_sg,
                          tl.program_id(1) * (BLOCK // 128), I // 128, BLOCK)
    else:
        tl.store(y_ptr + row * s_y + offs, y, mask=ok)

"""Triton kernels for the block-FP8 linear layer on Hopper: W8A8 with block scales.

Two kernels, compiled on first use (triton is imported lazily by callers):

- ``act_quant_fp8``: dynamic 1x128 activation quantization, bit-identical to
  ``formats.BlockFP8.quantize_activation`` (correctly rounded divisions, explicit
  saturation, round-to-nearest-even cast). Scales are written outer-dim-major
  ([M, K/128] with stride (1, M)), the layout torch._scaled_mm wants for 1x128.
- ``fp8_block_gemm``: y = (a_codes * a_scale) @ (w_codes * w_scale)^T with FP8
  tensor-core dots over K blocks of 128, each block's partial product scaled in
  float32 and accumulated in float32 (the promotion DeepSeek-V3 prescribes). Split-K
  writes float32 partials that a deterministic sum reduces, so small-M decode can
  spread one weight read over all multiprocessors without atomics.
"""

from __future__ import annotations

import triton
import triton.language as tl

FP32_TINY = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def act_quant_fp8_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, stride_sg,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0)
    g = tl.program_id(1)
    offs = g * BLOCK + tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(tl.math.div_rn(amax, 448.0), FP32_TINY)
    scale = tl.where(amax > 0, scale, 0.0)
    divisor = tl.where(scale > 0, scale, 1.0)
    q = tl.math.div_rn(x, divisor)
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    tl.store(q_ptr + row * stride_qm + offs, q.to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + row * stride_sm + g * stride_sg, scale)


@triton.jit
def fp8_block_gemm_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, c_ptr, M, N, K,
                          s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_cs, s_cm, s_cn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          K_BLOCKS_PER_SPLIT: tl.constexpr, IMPRECISE_ACC: tl.constexpr, QUANT_A: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    kb0 = split * K_BLOCKS_PER_SPLIT
    a_ptrs = a_ptr + offs_m[:, None] * s_am + (kb0 * BLOCK_K + offs_k[None, :]) * s_ak
    w_ptrs = w_ptr + offs_n[None, :] * s_wn + (kb0 * BLOCK_K + offs_k[:, None]) * s_wk
    as_ptrs = as_ptr + offs_m * s_asm
    ws_ptrs = ws_ptr + (offs_n // 128) * s_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(0, K_BLOCKS_PER_SPLIT):
        kb = kb0 + i
        k_ok = offs_k < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if QUANT_A:
            # the activation's 1x128 group quantized in registers, exactly as act_quant_fp8_kernel does
            x = a.to(tl.float32)
            amax = tl.max(tl.abs(x), axis=1)
            a_s = tl.maximum(tl.math.div_rn(amax, 448.0), FP32_TINY)
            a_s = tl.where(amax > 0, a_s, 0.0)
            divisor = tl.where(a_s > 0, a_s, 1.0)
            a = tl.minimum(tl.maximum(tl.math.div_rn(x, divisor[:, None]), -448.0), 448.0).to(tl.float8e4nv)
        else:
            a_s = tl.load(as_ptrs + kb * s_ask, mask=m_ok & (kb * BLOCK_K < K), other=0.0)
        w_s = tl.load(ws_ptrs + kb * s_wsk, mask=n_ok & (kb * BLOCK_K < K), other=0.0)
        acc += tl.dot(a, w, max_num_imprecise_acc=IMPRECISE_ACC) * a_s[:, None] * w_s[None, :]
        a_ptrs += BLOCK_K * s_ak
        w_ptrs += BLOCK_K * s_wk
    c_ptrs = c_ptr + split * s_cs + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def splitk_reduce_kernel(p_ptr, c_ptr, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """c = sum over s of partials[s] (float32, in order s = 0, 1, ...), cast to c's dtype:
    the split-K epilogue in one launch (a torch sum and a cast were two)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(p_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)

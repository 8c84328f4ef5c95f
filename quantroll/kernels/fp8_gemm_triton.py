"""Triton kernels for the block-FP8 linear layer on Hopper: W8A8 with block scales.

Three kernels, compiled on first use (triton is imported lazily by callers):

- ``act_quant_fp8``: dynamic 1x128 activation quantization, bit-identical to
  ``formats.BlockFP8.quantize_activation`` (correctly rounded divisions, explicit
  saturation, round-to-nearest-even cast). Scales are written outer-dim-major
  ([M, K/128] with stride (1, M)), the layout torch._scaled_mm wants for 1x128.
- ``fp8_decode_gemm`` (M <= 64) and ``fp8_block_gemm`` (prefill): y = (a_codes *
  a_scale) @ (w_codes * w_scale)^T as tensor-core dots over K blocks of 128, each
  block's partial product scaled and accumulated in float32 (the promotion DeepSeek-V3
  prescribes). The decode kernel splits K for small M and sums the splits in-kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantroll.kernels.gemm_tile_triton import gemm_tile


FP32_TINY = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def act_quant_fp8_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, stride_sg,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row x stride passes 2^31 on long prefills
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
                          s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_cm, s_cn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F16: tl.constexpr,
                          IMPRECISE_ACC: tl.constexpr = 32):
    """Prefill GEMM (M > 64) for shapes cuBLAS does not take: y = (a * a_s) @ (w * w_s)^T."""
    offs_m, offs_n, offs_k, m_ok, n_ok, a_ptrs, w_ptrs = gemm_tile(a_ptr, w_ptr, M, N, s_am, s_ak, s_wn, s_wk,
                                                                    BLOCK_M, BLOCK_N, BLOCK_K)
    as_ptrs = as_ptr + offs_m * s_asm
    ws_ptrs = ws_ptr + (offs_n // 128) * s_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        a_s = tl.load(as_ptrs + kb * s_ask, mask=m_ok, other=0.0)
        w_s = tl.load(ws_ptrs + kb * s_wsk, mask=n_ok, other=0.0)
        if DOT_F16:  # float32 accumulation on the float16 tensor cores (see fp8_decode_gemm_kernel)
            part = tl.dot(a.to(tl.float16), w.to(tl.float16))
        else:  # FP8 warpgroup MMA, promoted to float32 every IMPRECISE_ACC products (and after the block)
            part = tl.dot(a, w, max_num_imprecise_acc=IMPRECISE_ACC)
        acc += part * a_s[:, None] * w_s[None, :]
        a_ptrs += BLOCK_K * s_ak
        w_ptrs += BLOCK_K * s_wk
    c_ptrs = c_ptr + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def fp8_decode_gemm_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, part_ptr, c_ptr, lock_ptr, M, N, K,
                           s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_cm, s_cn,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           K_BLOCKS_PER_SPLIT: tl.constexpr, SPLIT: tl.constexpr,
                           DOT_F16: tl.constexpr, IMPRECISE_ACC: tl.constexpr):
    """The decode GEMM (M <= 64), computed transposed: y^T[N, M] = W[N, K] . a^T[K, M], so
    the weight rows fill the MMA's 64-row side and the few tokens its narrow side.

    DOT_F16: FP8 codes widened to float16 (exact: every e4m3 value is a float16) and
    multiplied on the float16 tensor cores, which accumulate in float32; the FP8 MMA sums
    each chunk of products in a narrower accumulator (DeepSeek-V3 measured ~14 bits), and
    those differences flip BF16 output roundings. Decode reads weights, it does not wait
    on the tensor cores, so the wider MMA costs no time there.

    SPLIT > 1: each split writes its float32 partial tile, and the program that finishes
    last for that tile (a counter per tile, reset by it) sums the partials in split order
    and stores the output: one launch, and the same sum whoever arrives last."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    decode_gemm_tile(a_ptr, as_ptr, w_ptr, ws_ptr, part_ptr, c_ptr, lock_ptr, M, N, K, pid_n, pid_m, split,
                     pid_m * tl.num_programs(0) + pid_n, s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_cm, s_cn,
                     BLOCK_M, BLOCK_N, BLOCK_K, K_BLOCKS_PER_SPLIT, SPLIT, DOT_F16, IMPRECISE_ACC)


@triton.jit
def decode_gemm_acc(a_ptr, as_ptr, w_ptr, ws_ptr, offs_m, m_ok, offs_n, n_ok, kb0, K,
                    s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_BLOCKS: tl.constexpr,
                    DOT_F16: tl.constexpr, IMPRECISE_ACC: tl.constexpr):
    """The float32 tile [BLOCK_N, BLOCK_M] of W[offs_n] . a[offs_m]^T over K blocks kb0 ..
    kb0 + K_BLOCKS - 1, each block's dot scaled by its weight and activation scales and
    added in block order (see fp8_decode_gemm_kernel)."""
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None] * s_wn + (kb0 * BLOCK_K + offs_k[None, :]) * s_wk
    a_ptrs = a_ptr + offs_m[None, :] * s_am + (kb0 * BLOCK_K + offs_k[:, None]) * s_ak
    as_ptrs = as_ptr + offs_m * s_asm
    ws_ptrs = ws_ptr + (offs_n // 128) * s_wsn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(0, K_BLOCKS):
        kb = kb0 + i
        k_ok = offs_k < K - kb * BLOCK_K
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=k_ok[:, None] & m_ok[None, :], other=0.0)
        a_s = tl.load(as_ptrs + kb * s_ask, mask=m_ok & (kb * BLOCK_K < K), other=0.0)
        w_s = tl.load(ws_ptrs + kb * s_wsk, mask=n_ok & (kb * BLOCK_K < K), other=0.0)
        if DOT_F16:
            part = tl.dot(w.to(tl.float16), a.to(tl.float16))
        else:
            part = tl.dot(w, a, max_num_imprecise_acc=IMPRECISE_ACC)
        acc += part * w_s[:, None] * a_s[None, :]
        w_ptrs += BLOCK_K * s_wk
        a_ptrs += BLOCK_K * s_ak
    return acc


@triton.jit
def decode_gemm_tile(a_ptr, as_ptr, w_ptr, ws_ptr, part_ptr, c_ptr, lock_ptr, M, N, K, pid_n, pid_m, split, tile,
                     s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_cm, s_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     K_BLOCKS_PER_SPLIT: tl.constexpr, SPLIT: tl.constexpr,
                     DOT_F16: tl.constexpr, IMPRECISE_ACC: tl.constexpr):
    """One program's share of the decode GEMM: output tile (pid_n, pid_m), K split
    ``split``; ``tile`` numbers the output tile for the split-K partials and counters."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = decode_gemm_acc(a_ptr, as_ptr, w_ptr, ws_ptr, offs_m, m_ok, offs_n, n_ok, split * K_BLOCKS_PER_SPLIT, K,
                          s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk,
                          BLOCK_M, BLOCK_N, BLOCK_K, K_BLOCKS_PER_SPLIT, DOT_F16, IMPRECISE_ACC)
    c_ptrs = c_ptr + offs_m[None, :] * s_cm + offs_n[:, None] * s_cn
    ok = n_ok[:, None] & m_ok[None, :]
    if SPLIT == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=ok)
    else:
        p_ptrs = part_ptr + tile * (SPLIT * BLOCK_N * BLOCK_M) + tl.arange(0, BLOCK_N)[:, None] * BLOCK_M \
            + tl.arange(0, BLOCK_M)[None, :]
        tl.store(p_ptrs + split * (BLOCK_N * BLOCK_M), acc)
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            total = tl.load(p_ptrs, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT):
                total += tl.load(p_ptrs + s * (BLOCK_N * BLOCK_M), cache_modifier=".cg")
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(lock_ptr + tile, 0)  # ready for the next call (and the next graph replay)

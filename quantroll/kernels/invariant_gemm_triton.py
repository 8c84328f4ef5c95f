"""The batch-invariant GEMM of ``--true-on-policy-mode`` on a GPU, in Triton.

y = x @ w^T with one tile shape whatever the number of rows: every program computes a
[BLOCK_M, BLOCK_N] tile over the whole K in BLOCK_K steps, in order, accumulating in
float32 on the tensor cores, and rounds once to the output dtype. No split-K, no shape-
dependent choice: a row's result depends on its own row and the weights alone (an MMA
row is computed from its own operand row), so the engine's decode step (a few rows),
its prefill and the trainer's forward (thousands) give that row the same bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantroll.kernels.gemm_tile_triton import gemm_tile


@triton.jit
def invariant_gemm_kernel(x_ptr, w_ptr, y_ptr, M, N, K, s_xm, s_xk, s_wn, s_wk, s_ym, s_yn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    offs_m, offs_n, offs_k, m_ok, n_ok, x_ptrs, w_ptrs = gemm_tile(x_ptr, w_ptr, M, N, s_xm, s_xk, s_wn, s_wk,
                                                                    BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K * s_xk
        w_ptrs += BLOCK_K * s_wk
    tl.store(y_ptr + offs_m[:, None] * s_ym + offs_n[None, :] * s_yn, acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])

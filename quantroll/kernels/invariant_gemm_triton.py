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


@triton.jit
def invariant_gemm_kernel(x_ptr, w_ptr, y_ptr, M, N, K, s_xm, s_xk, s_wn, s_wk, s_ym, s_yn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1).to(tl.int64)  # row offsets pass 2^31 elements in long training batches
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * s_xm + offs_k[None, :] * s_xk
    w_ptrs = w_ptr + offs_n[None, :] * s_wn + offs_k[:, None] * s_wk
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

"""What every row-tiled Triton GEMM of quantroll starts from: the output tile of a program
on a (N tiles, M tiles) grid, and its operands' first K step."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gemm_tile(x_ptr, w_ptr, M, N, s_xm, s_xk, s_wn, s_wk,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(offs_m, offs_n, offs_k, m_ok, n_ok, x_ptrs [BLOCK_M, BLOCK_K], w_ptrs [BLOCK_K, BLOCK_N])
    of this program's tile of y = x @ w^T (x [M, K], w [N, K]); row offsets in int64, as
    they pass 2^31 elements in long prefills and training batches."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * s_xm + offs_k[None, :] * s_xk
    w_ptrs = w_ptr + offs_n[None, :] * s_wn + offs_k[:, None] * s_wk
    return offs_m, offs_n, offs_k, m_ok, n_ok, x_ptrs, w_ptrs

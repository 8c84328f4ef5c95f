"""Error bounds shared by the GPU GEMM checks (the tests and the benches): what a float32-accurate
kernel with a BF16 output may differ from the float64 product."""

from __future__ import annotations

import torch


def float32_sum_bound(k: int) -> float:
    """Relative error allowed for float32 sums of k exact products (BF16 x BF16 and float16
    x float16 products fit float32 exactly): rounding errors of 2^-24 per add, random-walk
    growth sqrt(k), factor 4 of headroom. The H200 run of 2026-12-01 measured 1.0e-6 at
    K = 4096 and 1.4e-5 at K = 12288 (split 1), so a flat 1e-6 was too tight."""
    return 4 * k**0.5 * 2**-24


def excess_over_bf16_rounding(y: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> float:
    """max(|y - a w^T| - (half a BF16 ulp of a w^T + float32_sum_bound(K) |a| |w|^T)) for
    float64 operands a [M, K], w [N, K]: <= 0 when the BF16 output y is the float64 product
    rounded, up to float32 summation error (the CUDA decode GEMMs' check)."""
    ref, mag = a @ w.t(), a.abs() @ w.abs().t()
    half_ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref.abs())[1] - 9)  # 2^(e-1) * 2^-8
    return ((y.double() - ref).abs() - half_ulp - float32_sum_bound(a.shape[1]) * mag).max().item()

"""Launcher of the batch-invariant GEMM (invariant_gemm_triton.py) and its one tile shape."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class InvariantGemmTiles:
    """The one launch shape every batch-invariant GEMM takes, engine and trainer alike (any
    fixed choice is invariant). Chosen on the H200 (bench/true_on_policy_gpu.py --gemm-sweep
    and the default bench, docs/PERFORMANCE.md): 64 x 64 tiles keep 32-96 programs busy on the
    Qwen3-1.7B decode shapes, which have no split-K to fill the GPU, and a fourth stage hides
    the loads best at decode rows; 128 x 128 tiles train faster but decode slower."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    warps: int = 4
    stages: int = 4


def invariant_gemm(x: torch.Tensor, w: torch.Tensor, tiles: InvariantGemmTiles) -> torch.Tensor:
    """x [..., K] @ w [N, K]^T -> [..., N] in x's dtype (float32 accumulation)."""
    from quantroll.kernels.invariant_gemm_triton import invariant_gemm_kernel

    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    w = w.to(x.dtype)
    m, k = x2.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        grid = (-(-n // tiles.block_n), -(-m // tiles.block_m))
        invariant_gemm_kernel[grid](x2, w, y, m, n, k, x2.stride(0), x2.stride(1), w.stride(0), w.stride(1),
                                    y.stride(0), y.stride(1), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                                    BLOCK_K=tiles.block_k, IEEE=x.dtype == torch.float32, num_warps=tiles.warps,
                                    num_stages=tiles.stages)
    return y.reshape(*shape[:-1], n)

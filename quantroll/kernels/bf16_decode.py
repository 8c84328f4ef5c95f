"""The BF16 decode GEMM on the FP8 decode kernel's machinery (transposed tiles, split-K
summed in the same launch), for weights that stay BF16: an experiment against cuBLAS at
decode sizes (M <= 64), where cuBLAS reads the small projections well below the copy
rate (Qwen3-8B at M = 16, 2026-11-30: o_proj 13.7 us for 7.9 us of weight bytes, qkv
16.2 for 11.8). The BF16 engine's step is 1.33x / 1.31x its roofline at batch 16 / 64,
against the issue's 1.3x. Not wired into the model: `bench/gemm_decode.py --bf16` times
it against cuBLAS per layer shape; if it wins, QLinear's BF16 branch would call it.
Measured on the H200 (2026-12-01): no faster than cuBLAS anywhere that matters (o_proj at
M = 1/16 by 0.3-0.6 us; slower for qkv, gate_up and at M = 64), so it stays unwired.
"""

from __future__ import annotations

import torch

from quantroll.kernels.fp8_linear import DecodeGemmConfig, fp8_gemm_decode, splits_to_fill


def bf16_decode_config(n: int, k: int, m: int) -> DecodeGemmConfig:
    """The FP8 kernel's rule (32 weight rows per program on two warps, split-K until >= 512
    programs, at most 8 splits): twice the bytes per weight row, the same tile count."""
    return DecodeGemmConfig(block_n=32, split_k=splits_to_fill((n + 31) // 32, k, 512), num_warps=2,
                            num_stages=4 if m == 1 else 3)


def bf16_gemm_decode(x: torch.Tensor, w: torch.Tensor, out_dtype=None, cfg: DecodeGemmConfig | None = None
                     ) -> torch.Tensor:
    """y = x @ w^T for x [M, K] (M <= 64) and w [N, K], BF16 (or float16) -> [M, N], float32
    accumulation; the splits' partial sums added in split order (the same bits every run):
    ``fp8_gemm_decode`` without scales."""
    m, k = x.shape
    if m > 64 or w.shape[1] != k or x.dtype != w.dtype:
        raise ValueError(f"bf16_gemm_decode: x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}: "
                         "needs M <= 64, the same K and dtype")
    if m == 0:
        return torch.empty(0, w.shape[0], dtype=out_dtype or x.dtype, device=x.device)
    return fp8_gemm_decode(x, None, w, None, out_dtype or x.dtype, cfg or bf16_decode_config(w.shape[0], k, m))

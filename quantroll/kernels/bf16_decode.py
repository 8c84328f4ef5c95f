"""The BF16 decode GEMM on the FP8 decode kernel's machinery (transposed tiles, split-K
summed in the same launch), for weights that stay BF16: an experiment against cuBLAS at
decode sizes (M <= 64), where cuBLAS reads the small projections well below the copy
rate (Qwen3-8B at M = 16, 2026-11-30: o_proj 13.7 us for 7.9 us of weight bytes, qkv
16.2 for 11.8). The BF16 engine's step is 1.33x / 1.31x its roofline at batch 16 / 64,
against the issue's 1.3x. Not wired into the model: `bench/gemm_decode.py --bf16` times
it against cuBLAS per layer shape; if it wins, QLinear's BF16 branch would call it.
Written 2026-12-01 without device time (interpreter and sm_90 compile only).
"""

from __future__ import annotations

import torch

from quantroll.kernels.fp8_linear import _MAX_TILES, DecodeGemmConfig, _tile_counters, decode_grid


def bf16_decode_config(n: int, k: int, m: int) -> DecodeGemmConfig:
    """The FP8 kernel's rule (32 weight rows per program on two warps, split-K until >= 512
    programs, at most 8 splits): twice the bytes per weight row, the same tile count."""
    tiles, k_blocks, split = (n + 31) // 32, (k + 127) // 128, 1
    while tiles * split < 512 and split < 8 and k_blocks // (split * 2) >= 2:
        split *= 2
    return DecodeGemmConfig(block_n=32, split_k=split, num_warps=2, num_stages=4 if m == 1 else 3)


def bf16_gemm_decode(x: torch.Tensor, w: torch.Tensor, out_dtype=None, cfg: DecodeGemmConfig | None = None
                     ) -> torch.Tensor:
    """y = x @ w^T for x [M, K] (M <= 64) and w [N, K], BF16 (or float16) -> [M, N], float32
    accumulation; the splits' partial sums added in split order (the same bits every run)."""
    from quantroll.kernels.fp8_gemm_triton import fp8_decode_gemm_kernel

    m, k = x.shape
    n = w.shape[0]
    if m > 64 or w.shape[1] != k or x.dtype != w.dtype:
        raise ValueError(f"bf16_gemm_decode: x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}: "
                         "needs M <= 64, the same K and dtype")
    cfg = cfg or bf16_decode_config(n, k, m)
    block_m, per_split, grid = decode_grid(m, n, k, cfg)
    split = grid[2]
    y = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if split > 1:
        if grid[0] * grid[1] > _MAX_TILES:
            raise ValueError(f"bf16_gemm_decode: {grid[0] * grid[1]} output tiles exceed {_MAX_TILES} counters")
        partials = torch.empty(grid[0] * grid[1] * split * cfg.block_n * block_m, dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device)
    else:
        partials = counters = y  # unused by the kernel
    if m:
        fp8_decode_gemm_kernel[grid](
            x, x, w, w, partials, y, counters, m, n, k,
            x.stride(0), x.stride(1), 0, 0, w.stride(0), w.stride(1), 0, 0, y.stride(0), y.stride(1),
            BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=128, K_BLOCKS_PER_SPLIT=per_split, SPLIT=split,
            DOT_F16=False, IMPRECISE_ACC=32, SCALED=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y

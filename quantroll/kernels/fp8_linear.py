"""The block-FP8 linear layer on Hopper: activation quantization + FP8 GEMM.

Every path computes (a_q * a_s) @ (w_q * w_s)^T with 1x128 activation and 128x128 weight
scales in float32; which kernel a product takes is one table (gemm_plan.FP8_GEMMS, chosen
from measurements): the CUDA decode kernel (fp8_gemv.py) to 16 rows, CUTLASS's blockwise
kernels (cutlass_gemm.py) on the shapes and rows where they won, the Triton decode kernel on
FP8 warpgroup MMA at 17-64 rows, cuBLAS' blockwise GEMM above (torch._scaled_mm,
scaled_mm.py), the row-tiled Triton GEMM where cuBLAS does not run.

The activation is quantized once per call by its own kernel, or arrives quantized
(``Fp8Activation``) from the kernel that produced it. ``fp8_linear_forward`` is the
QLinear backend ("fp8") registered when a CUDA device with FP8 tensor cores (sm_89+) is
present.
"""

from __future__ import annotations

import torch

from quantroll.kernels import fp8_gemv
from quantroll.kernels.gemm_plan import (FP8_GEMMS, DecodeGemmConfig, GemmPlan, PrefillGemmConfig,  # noqa: F401
                                         decode_block_m)
from quantroll.kernels.scaled_mm import fp8_gemm_scaled_mm
from quantroll.kernels.counters import counters
from quantroll.kernels.backends import BACKENDS, fp8_hardware_available  # noqa: F401 (its users' name)
from quantroll.kernels.fp8_activation import Fp8Activation, fp8_activation_buffers  # noqa: F401 (its users' names)


def quantize_activation_fp8(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [M, K] e4m3, scales [M, ceil(K/128)] float32, outer-dim-major)."""
    from quantroll.kernels.fp8_gemm_triton import act_quant_fp8_kernel

    m, k = x2d.shape
    groups = (k + 127) // 128
    q, s = fp8_activation_buffers(m, k, x2d.device)
    if m:
        act_quant_fp8_kernel[(m, groups)](x2d, q, s, k, x2d.stride(0), q.stride(0), s.stride(0), s.stride(1), BLOCK=128)
    return q, s


def fp8_gemm_prefill(aq, a_s, wq, w_s, out_dtype=torch.bfloat16, cfg: PrefillGemmConfig = PrefillGemmConfig()
                     ) -> torch.Tensor:
    from quantroll.kernels.fp8_gemm_triton import fp8_block_gemm_kernel

    m, k = aq.shape
    n = wq.shape[0]
    y = torch.empty(m, n, dtype=out_dtype, device=aq.device)
    grid = ((n + cfg.block_n - 1) // cfg.block_n, (m + cfg.block_m - 1) // cfg.block_m)
    fp8_block_gemm_kernel[grid](
        aq, a_s, wq, w_s, y, m, n, k,
        aq.stride(0), aq.stride(1), a_s.stride(0), a_s.stride(1), wq.stride(0), wq.stride(1),
        w_s.stride(0), w_s.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=128, DOT_F16=cfg.dot_f16, IMPRECISE_ACC=cfg.imprecise_acc,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y


_MAX_TILES = 1 << 16
TILE_COUNTERS = "split-K tiles"  # counters.py kind


def _tile_counters(device: torch.device) -> torch.Tensor:
    """The arrival counters of the in-kernel split-K reduction (counters.py)."""
    return counters(TILE_COUNTERS, device, _MAX_TILES)


def decode_grid(m: int, n: int, k: int, cfg: DecodeGemmConfig) -> tuple[int, int, tuple[int, int, int]]:
    """(token rows per tile, K blocks per split, launch grid (N tiles, M tiles, splits)) of
    the decode kernel: 16/32/64-row token tiles, the splits evened out over K's 128-blocks
    (so none is empty)."""
    block_m = cfg.block_m or decode_block_m(m)
    k_blocks = (k + 127) // 128
    split = max(1, min(cfg.split_k, k_blocks))
    per_split = (k_blocks + split - 1) // split
    split = (k_blocks + per_split - 1) // per_split
    return block_m, per_split, ((n + cfg.block_n - 1) // cfg.block_n, (m + block_m - 1) // block_m, split)


def split_k_scratch(block_m: int, grid: tuple[int, int, int], block_n: int, device, placeholder: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 partial tiles, tile counters) for a decode-kernel launch of ``grid``; with
    one split, ``placeholder`` twice (the kernel touches neither)."""
    tiles, split = grid[0] * grid[1], grid[2]
    if split == 1:
        return placeholder, placeholder
    if tiles > _MAX_TILES:
        raise ValueError(f"decode GEMM: {tiles} output tiles exceed the {_MAX_TILES} split-K counters")
    return (torch.empty(tiles * split * block_n * block_m, dtype=torch.float32, device=device),
            _tile_counters(device))


def fp8_gemm_decode(aq, a_s, wq, w_s, out_dtype=torch.bfloat16, cfg: DecodeGemmConfig | None = None) -> torch.Tensor:
    """The decode GEMM on FP8 codes, one launch (see fp8_decode_gemm_kernel); ``cfg`` None:
    the tiles the table gives this product."""
    from quantroll.kernels.fp8_gemm_triton import fp8_decode_gemm_kernel

    m, k = aq.shape
    n = wq.shape[0]
    cfg = (cfg or decode_config(m, n, k)).for_shape(m, n, k)
    block_m, per_split, grid = decode_grid(m, n, k, cfg)
    y = torch.empty(m, n, dtype=out_dtype, device=aq.device)
    partials, counters = split_k_scratch(block_m, grid, cfg.block_n, aq.device, y)
    fp8_decode_gemm_kernel[grid](
        aq, a_s, wq, w_s, partials, y, counters, m, n, k,
        aq.stride(0), aq.stride(1), *a_s.stride(), wq.stride(0), wq.stride(1), *w_s.stride(), y.stride(0), y.stride(1),
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=128, K_BLOCKS_PER_SPLIT=per_split, SPLIT=grid[2],
        DOT_F16=cfg.dot_f16, IMPRECISE_ACC=cfg.imprecise_acc, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return y


def decode_config(m: int, n: int, k: int, plan: GemmPlan = FP8_GEMMS) -> DecodeGemmConfig:
    """The Triton decode tiles ``plan`` gives an M x N x K product (the first decode row
    covering it, whatever kernel would run before it)."""
    for row in plan.rows:
        if row.kernel == "triton decode" and row.covers(m, n, k):
            return row.tiles
    raise ValueError(f"no 'triton decode' row of the GEMM plan covers M = {m}, N = {n}, K = {k}")


def gemm_path(m: int, n: int, k: int, device: torch.device, out_dtype: torch.dtype = torch.bfloat16,
              plan: GemmPlan = FP8_GEMMS) -> str:
    """Which FP8 GEMM an M x N x K product on ``device`` takes (the kernel of ``plan``'s
    first row that covers it and runs there): one of gemm_plan.KERNELS."""
    return plan.choose(m, n, k, torch.device(device), out_dtype).kernel


def fp8_gemm(aq, a_s, wq, w_s, out_dtype=torch.bfloat16, plan: GemmPlan = FP8_GEMMS, early: bool = True
             ) -> torch.Tensor:
    """The FP8 GEMM for an activation of M rows, by ``plan``; ``early``: the CUDA decode and
    CUTLASS kernels' programmatic dependent launch (EngineKernels.early_launch)."""
    m, k = aq.shape
    n = wq.shape[0]
    if m == 0:  # an empty batch: no launch (a grid dimension of 0 is not launchable)
        return torch.empty(0, n, dtype=out_dtype, device=aq.device)
    # rows the CUDA and CUTLASS kernels cannot load (16 bytes at a time) take the next row's kernel
    row = plan.choose(m, n, k, aq.device, out_dtype,
                      () if fp8_gemv.rows_loadable(aq, wq) else ("cuda decode", "cutlass"))
    if row.kernel == "cuda decode":
        return fp8_gemv.fp8_gemv(aq, a_s, wq, w_s, early=early)
    if row.kernel == "cutlass":
        from quantroll.kernels.cutlass_gemm import cutlass_fp8_gemm

        return cutlass_fp8_gemm(aq, a_s, wq, w_s, out_dtype, row.tiles.config, row.tiles.splits, early=early)
    if row.kernel == "triton decode":
        return fp8_gemm_decode(aq, a_s, wq, w_s, out_dtype, row.tiles)
    if row.kernel == "cublas":
        return fp8_gemm_scaled_mm(aq, a_s, wq, w_s, out_dtype)
    return fp8_gemm_prefill(aq, a_s, wq, w_s, out_dtype, row.tiles)


def fp8_linear_forward(layer, x) -> torch.Tensor:
    """QLinear backend: real FP8 GEMMs on the layer's block-FP8 buffers."""
    shape = x.shape
    choices = layer.kernels.gpu
    if isinstance(x, Fp8Activation):
        y = fp8_gemm(x.codes, x.scales, layer.weight, layer.weight_scale, x.dtype, choices.fp8_gemms,
                     choices.early_launch)
    else:
        x2d = x.reshape(-1, shape[-1])
        y = fp8_gemm(*quantize_activation_fp8(x2d if x2d.is_contiguous() else x2d.contiguous()), layer.weight,
                     layer.weight_scale, x.dtype, choices.fp8_gemms, choices.early_launch)
    if layer.bias is not None:
        y = y + layer.bias
    return y.reshape(*shape[:-1], layer.out_features)


BACKENDS["fp8"] = fp8_linear_forward

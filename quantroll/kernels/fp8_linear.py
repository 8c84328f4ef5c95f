"""The block-FP8 linear layer on Hopper: activation quantization + FP8 GEMM.

Every path computes (a_q * a_s) @ (w_q * w_s)^T with 1x128 activation and 128x128 weight
scales in float32, and they differ only in accumulation order; ``fp8_gemm`` picks one
(``gemm_path``):

- decode, M <= 16: the CUDA kernel of fp8_gemv.py (weights streamed into mma.sync's
  registers, launched ahead of the kernel that feeds it), float32-accurate, where nvcc
  can build it;
- decode (M <= 64, and M <= 16 without nvcc): ``fp8_decode_gemm_kernel``, transposed
  tiles of 32 weight rows (64 on long-K weights at 17-64 rows, ``LONG_K_DECODE``), split-K
  summed in the same launch, products on mma.sync
  (Triton widens the FP8 codes to float16), float32-accurate.
  It reads the FP8 weights near full bandwidth, where cuBLAS refuses M = 1 and is barely
  faster than BF16 at M = 16-64.
- prefill on shapes cuBLAS verified (``scaled_mm_supports``), on Hopper with torch >= 2.9
  (``scaled_mm_verified_on``): torch._scaled_mm with blockwise scales (cuBLAS, CUDA >=
  12.9); Hopper's FP8 warpgroup MMA accumulates each chunk of products in a narrower
  accumulator, so these outputs sit ~1e-4 (relative) from float64 where the Triton paths
  sit ~1e-7.
- prefill on other shapes (small models): ``fp8_block_gemm_kernel`` with the codes
  widened to float16 (exact) on the float16 tensor cores, float32-accurate.

The activation is quantized once per call by its own kernel, or arrives quantized
(``Fp8Activation``) from the kernel that produced it. ``fp8_linear_forward`` is the
QLinear backend ("fp8") registered when a CUDA device with FP8 tensor cores (sm_89+) is
present.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from quantroll.kernels import fp8_gemv
from quantroll.kernels.scaled_mm import fp8_gemm_scaled_mm, scaled_mm_supports, scaled_mm_verified_on
from quantroll.kernels.counters import counters
from quantroll.model.linear import BACKENDS


@dataclass(frozen=True)
class PrefillGemmConfig:
    """Tiles of ``fp8_block_gemm_kernel`` (prefill on shapes cuBLAS does not take)."""

    block_m: int = 64
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3
    dot_f16: bool = True  # float16 MMA: float32-accurate; False: FP8 warpgroup MMA (narrower accumulation)
    imprecise_acc: int = 32  # FP8 MMA only: products summed in the narrow accumulator before a float32 promotion


@dataclass(frozen=True)
class Fp8Activation:
    """A BF16 activation that the kernel producing it (RMSNorm, silu*up) already quantized
    per 1x128 group, bit-identical to ``quantize_activation_fp8`` on the BF16 values: the
    FP8 linear that consumes it skips its own quantization launch. ``shape`` and ``dtype``
    are those of the BF16 tensor it stands for; ``source`` is that tensor when the producer
    wrote it too (a MoE block routes on it)."""

    codes: torch.Tensor  # [M, K] float8_e4m3fn
    scales: torch.Tensor  # [M, ceil(K/128)] float32, outer-dim-major (stride (1, M))
    shape: torch.Size
    dtype: torch.dtype
    source: torch.Tensor | None = None


def fp8_activation_buffers(m: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty codes [M, K] e4m3 and scales [M, ceil(K/128)] float32 laid out outer-dim-major
    (stride (1, M)), the layout torch._scaled_mm and the Triton GEMMs read; every producer
    of an FP8 activation allocates through here."""
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=device)
    scales = torch.empty((k + 127) // 128, m, dtype=torch.float32, device=device).t()
    return codes, scales


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


@dataclass(frozen=True)
class DecodeGemmConfig:
    """Tiles of ``fp8_decode_gemm_kernel`` (weight rows per program, K splits, MMA type)."""

    block_n: int = 32
    split_k: int = 1
    dot_f16: bool = False  # widen the codes to float16 (float32-accurate on any MMA; slower)
    imprecise_acc: int = 32  # FP8 warpgroup MMA only (block_n >= 64)
    num_warps: int = 2
    num_stages: int = 3
    block_m: int = 0  # token rows per tile; 0: 16, 32 or 64 by M


_MAX_TILES = 1 << 16
TILE_COUNTERS = "split-K tiles"  # counters.py kind


def _tile_counters(device: torch.device) -> torch.Tensor:
    """The arrival counters of the in-kernel split-K reduction (counters.py)."""
    return counters(TILE_COUNTERS, device, _MAX_TILES)


def decode_grid(m: int, n: int, k: int, cfg: DecodeGemmConfig) -> tuple[int, int, tuple[int, int, int]]:
    """(token rows per tile, K blocks per split, launch grid (N tiles, M tiles, splits)) of
    the decode kernel: 16/32/64-row token tiles, the splits evened out over K's 128-blocks
    (so none is empty)."""
    block_m = cfg.block_m or (16 if m <= 16 else (32 if m <= 32 else 64))
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
    """The decode GEMM (M <= 64) on FP8 codes, one launch (see fp8_decode_gemm_kernel)."""
    from quantroll.kernels.fp8_gemm_triton import fp8_decode_gemm_kernel

    m, k = aq.shape
    n = wq.shape[0]
    cfg = cfg or decode_config(n, k, m)
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


# Decode batches of 17-64 rows on long-K weights (K >= 3 N: Qwen3-8B's down_proj) take 64
# weight rows per program with float16 dots (still mma.sync on 2 warps, as accurate):
# measured on the H200 (bench/gemm_f16_tokens.py, 2026-12-01) at 20.7 against 28.3 us at
# M = 32 and 28.9 against 30.6 at M = 64. None: the 32-row tiles for every shape.
LONG_K_DECODE: DecodeGemmConfig | None = DecodeGemmConfig(block_n=64, dot_f16=True, num_warps=2, num_stages=3)


def decode_config(n: int, k: int, m: int) -> DecodeGemmConfig:
    """Decode tiles, measured on the H200 over Qwen3-8B's layer shapes at M = 1, 16, 64
    (bench/gemm_decode.py, docs/PERFORMANCE.md): 32 weight rows per program and two warps,
    which Triton compiles to mma.sync on the FP8 codes widened to float16 (sm_90 PTX of
    Triton 3.6 and 3.8; float32-accurate, 1e-7 from float64, where the FP8 warpgroup MMA
    lands 4.5e-5 away), and split-K until >= 512 programs stream the weights (at most 8
    splits). (Triton's float16 warpgroup MMA on 4 warps, as accurate, was slower at every
    8B shape at 64 rows: 149.5 vs 105.9 us per layer set, 2026-12-01; removed.)"""
    if LONG_K_DECODE is not None and m > 16 and k >= 3 * n:
        bn = LONG_K_DECODE.block_n
        return dataclasses.replace(LONG_K_DECODE, split_k=splits_to_fill((n + bn - 1) // bn, k, 512))
    return DecodeGemmConfig(block_n=32, split_k=splits_to_fill((n + 31) // 32, k, 512), dot_f16=False, num_warps=2,
                            num_stages=5 if m == 1 else 3)


def splits_to_fill(tiles: int, k: int, target: int) -> int:
    """K splits for ``tiles`` output tiles: doubled until tiles x splits >= ``target``
    programs, at most 8, and each split at least two 128-wide K blocks."""
    k_blocks, split = (k + 127) // 128, 1
    while tiles * split < target and split < 8 and k_blocks // (split * 2) >= 2:
        split *= 2
    return split


def gemm_path(m: int, n: int, k: int, device: torch.device, out_dtype: torch.dtype = torch.bfloat16) -> str:
    """Which FP8 GEMM an M x N x K product on ``device`` takes (``fp8_gemm`` follows it; a
    CUDA-kernel choice also needs 16-byte aligned rows, which every engine buffer has):
    "cuda decode" (fp8_gemv, M <= fp8_gemv.MAX_M), "triton decode" (M <= 64), "cublas"
    (torch._scaled_mm on the shapes verified for it) or "triton prefill"."""
    if m <= fp8_gemv.MAX_M and fp8_gemv.supports_shape(m, n, k, out_dtype) and fp8_gemv.usable(device):
        return "cuda decode"
    if m <= 64:
        return "triton decode"
    return "cublas" if scaled_mm_supports(m, n, k) and scaled_mm_verified_on(device) else "triton prefill"


def fp8_gemm(aq, a_s, wq, w_s, out_dtype=torch.bfloat16) -> torch.Tensor:
    """The FP8 GEMM for an activation of M rows (``gemm_path``)."""
    m, k = aq.shape
    n = wq.shape[0]
    if m == 0:  # an empty batch: no launch (a grid dimension of 0 is not launchable)
        return torch.empty(0, n, dtype=out_dtype, device=aq.device)
    path = gemm_path(m, n, k, aq.device, out_dtype)
    if path == "cuda decode" and fp8_gemv.supports(aq, wq, out_dtype):
        return fp8_gemv.fp8_gemv(aq, a_s, wq, w_s)
    if m <= 64:
        return fp8_gemm_decode(aq, a_s, wq, w_s, out_dtype, decode_config(n, k, m))
    if path == "cublas":
        return fp8_gemm_scaled_mm(aq, a_s, wq, w_s, out_dtype)
    return fp8_gemm_prefill(aq, a_s, wq, w_s, out_dtype)


def fp8_linear_forward(layer, x) -> torch.Tensor:
    """QLinear backend: real FP8 GEMMs on the layer's block-FP8 buffers."""
    shape = x.shape
    if isinstance(x, Fp8Activation):
        y = fp8_gemm(x.codes, x.scales, layer.weight, layer.weight_scale, x.dtype)
    else:
        x2d = x.reshape(-1, shape[-1])
        y = fp8_gemm(*quantize_activation_fp8(x2d if x2d.is_contiguous() else x2d.contiguous()), layer.weight,
                     layer.weight_scale, x.dtype)
    if layer.bias is not None:
        y = y + layer.bias
    return y.reshape(*shape[:-1], layer.out_features)


def fp8_hardware_available(device: torch.device | str | None = None) -> bool:
    """Whether ``device`` (None: the current CUDA device) runs the real FP8 GEMMs: a CUDA
    GPU with FP8 tensor cores (sm_89+) and Triton. A CPU device never does, also on a
    machine with a GPU."""
    from quantroll.kernels.quantize import triton_available

    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available() and triton_available() and torch.cuda.get_device_capability(device) >= (8, 9)


BACKENDS["fp8"] = fp8_linear_forward

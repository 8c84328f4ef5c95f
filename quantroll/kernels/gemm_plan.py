"""Which FP8 GEMM kernel a product of M token rows takes: one table, chosen from measurements.

Every kernel computes (a_q * a_s) @ (w_q * w_s)^T on the same 1x128 / 128x128 block-FP8
operands and all of them meet the per-linear numerics rule (docs/PERFORMANCE.md, "FP8
GEMMs ..."): float32 output within 1.5x of cuBLAS blockwise's relative error to float64 on
the same operands. They differ in speed only, so the choice is data: the first row of
``FP8_GEMMS`` whose M range (and weight shape, where a row names one) holds and whose
kernel runs here (``kernel_runs``) wins. A caller that wants another choice (a bench, a
test) passes its own ``GemmPlan``; nothing is switched globally.

Kernels:
- "cuda decode": fp8_gemv.py, weights streamed into mma.sync registers (M <= 16, BF16 out,
  needs nvcc); float32-accurate.
- "triton decode": fp8_decode_gemm_kernel, computed transposed (weights on the MMA's
  64-row side), split-K summed in-kernel; FP8 warpgroup MMA promoted to float32 per 128-K
  block with 64 weight rows and 4 warps, float16-widened mma.sync with 32 rows and 2.
- "cublas": torch._scaled_mm blockwise (Hopper, torch >= 2.9, verified shapes).
- "triton prefill": fp8_block_gemm_kernel, row-tiled; everywhere (the last resort).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from quantroll.kernels import fp8_gemv
from quantroll.kernels.scaled_mm import scaled_mm_supports, scaled_mm_verified_on

KERNELS = ("cuda decode", "triton decode", "cublas", "triton prefill")


@dataclass(frozen=True)
class DecodeGemmConfig:
    """Tiles of ``fp8_decode_gemm_kernel``: weight rows per program, K splits (0: doubled
    until ``fill_programs`` programs stream the weights, ``splits_to_fill``), MMA type."""

    block_n: int = 32
    split_k: int = 1
    dot_f16: bool = False  # widen the codes to float16 (float32-accurate on any MMA)
    imprecise_acc: int = 32  # FP8 warpgroup MMA only (block_n >= 64): products per float32 promotion
    num_warps: int = 2
    num_stages: int = 3
    block_m: int = 0  # token rows per tile; 0: 16, 32 or 64 by M
    fill_programs: int = 512  # split_k = 0 only

    def for_shape(self, m: int, n: int, k: int) -> "DecodeGemmConfig":
        """These tiles with split_k resolved for an M x N x K product (unchanged if fixed)."""
        if self.split_k:
            return self
        tiles = -(-n // self.block_n) * -(-m // (self.block_m or decode_block_m(m)))
        return dataclasses.replace(self, split_k=splits_to_fill(tiles, k, self.fill_programs))


def decode_block_m(m: int) -> int:
    """Token rows per decode tile when the config leaves it open: the narrowest of 16/32/64."""
    return 16 if m <= 16 else (32 if m <= 32 else 64)


def splits_to_fill(tiles: int, k: int, target: int) -> int:
    """K splits for ``tiles`` output tiles: doubled until tiles x splits >= ``target``
    programs, at most 8, and each split at least two 128-wide K blocks."""
    k_blocks, split = (k + 127) // 128, 1
    while tiles * split < target and split < 8 and k_blocks // (split * 2) >= 2:
        split *= 2
    return split


@dataclass(frozen=True)
class PrefillGemmConfig:
    """Tiles of ``fp8_block_gemm_kernel`` (the row-tiled GEMM, for shapes cuBLAS does not take)."""

    block_m: int = 64
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3
    dot_f16: bool = True  # float16 MMA: float32-accurate; False: FP8 warpgroup MMA
    imprecise_acc: int = 32  # FP8 MMA only: products summed in the narrow accumulator before a float32 promotion


@dataclass(frozen=True)
class GemmRow:
    """Products of ``min_m`` ... ``max_m`` rows (on weights of ``weight_shape`` = (N, K) only,
    where given) take ``kernel`` with ``tiles``; ``measured`` says which figure chose it."""

    kernel: str
    min_m: int = 1
    max_m: int = 1 << 62
    tiles: DecodeGemmConfig | PrefillGemmConfig | None = None
    weight_shape: tuple[int, int] | None = None
    measured: str = ""

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"GemmRow.kernel must be one of {KERNELS}, got {self.kernel!r}")
        wants = {"triton decode": DecodeGemmConfig, "triton prefill": PrefillGemmConfig}.get(self.kernel)
        if (wants is None) != (self.tiles is None) or (wants is not None and not isinstance(self.tiles, wants)):
            raise ValueError(f"GemmRow {self.kernel!r}: tiles must be {wants.__name__ if wants else 'None'}, "
                             f"got {self.tiles!r}")

    def covers(self, m: int, n: int, k: int) -> bool:
        return self.min_m <= m <= self.max_m and self.weight_shape in (None, (n, k))


def kernel_runs(kernel: str, m: int, n: int, k: int, device: torch.device, out_dtype: torch.dtype) -> bool:
    """Whether ``kernel`` takes this product on ``device`` (the CUDA kernel also needs 16-byte
    aligned rows, which ``fp8_gemm`` checks on the tensors; every engine buffer has them)."""
    if kernel == "cuda decode":
        return fp8_gemv.supports_shape(m, n, k, out_dtype) and fp8_gemv.usable(device)
    if kernel == "cublas":
        return scaled_mm_supports(m, n, k) and scaled_mm_verified_on(device)
    return True


@dataclass(frozen=True)
class GemmPlan:
    """The table: rows in priority order; the last must cover every product."""

    rows: tuple[GemmRow, ...]

    def __post_init__(self):
        last = self.rows[-1] if self.rows else None
        if last is None or last.kernel != "triton prefill" or last.min_m != 1 or last.weight_shape is not None:
            raise ValueError("GemmPlan: the last row must be 'triton prefill' for every M and shape")

    def choose(self, m: int, n: int, k: int, device: torch.device, out_dtype: torch.dtype = torch.bfloat16,
               exclude: tuple[str, ...] = ()) -> GemmRow:
        """The first row covering the product whose kernel runs here and is not in ``exclude``
        (fp8_gemm excludes the CUDA kernel for operands it cannot load)."""
        for row in self.rows:
            if (row.kernel not in exclude and row.covers(m, n, k)
                    and kernel_runs(row.kernel, m, n, k, device, out_dtype)):
                return row
        raise AssertionError("unreachable: the last row covers every product")


# FP8 warpgroup MMA, 64 weight rows, 4 warps, the whole 128-K block per float32 promotion
# (DeepGEMM's promotion interval), split-K until 384 programs: the fastest kernel that meets
# the rule at 17-64 rows on Qwen3-8B and 1.7B (bench/gemm_native_fp8.py, 2026-12-02, layer
# set at M = 64: 84.5 us on 8B against 104.5 for the float16-widened kernel, 113.5 for
# cuBLAS BF16; error 1.27e-4, cuBLAS FP8 1.27e-4).
NATIVE_DECODE = DecodeGemmConfig(block_n=64, split_k=0, fill_programs=384, dot_f16=False, imprecise_acc=128,
                                 num_warps=4, num_stages=4)
# float16-widened mma.sync, 32 weight rows, 2 warps (float32-accurate): M <= 16 where the
# CUDA kernel is not built (bench/gemm_decode.py, 2026-12-01).
NARROW_DECODE = DecodeGemmConfig(block_n=32, split_k=0, fill_programs=512, num_warps=2, num_stages=3)

FP8_GEMMS = GemmPlan((
    GemmRow("cuda decode", max_m=16, measured="bench/gemv_cuda.py"),
    GemmRow("triton decode", max_m=1, tiles=dataclasses.replace(NARROW_DECODE, num_stages=5),
            measured="bench/gemm_decode.py"),
    GemmRow("triton decode", max_m=16, tiles=NARROW_DECODE, measured="bench/gemm_decode.py"),
    GemmRow("triton decode", min_m=17, max_m=64, tiles=NATIVE_DECODE, measured="bench/gemm_native_fp8.py"),
    # Qwen3-1.7B down_proj at 65-128 rows: 128 token rows per tile, 4 splits (18.3 against
    # cuBLAS' 20.8 us at M = 96-128); every other shape above 64 rows: cuBLAS.
    GemmRow("triton decode", min_m=65, max_m=128, weight_shape=(2048, 6144),
            tiles=DecodeGemmConfig(block_n=64, block_m=128, split_k=4, imprecise_acc=128, num_warps=4, num_stages=3),
            measured="bench/gemm_native_fp8.py"),
    GemmRow("cublas", min_m=65, measured="bench/gemm_native_fp8.py"),
    GemmRow("triton prefill", tiles=PrefillGemmConfig()),
))

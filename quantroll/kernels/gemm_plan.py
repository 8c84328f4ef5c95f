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
- "cutlass": CUTLASS 3.x warp-specialized blockwise-scaled kernels (cutlass_gemm.py, the
  kernels vLLM and SGLang run; sm_90a, built at first use from the optional nvidia-cutlass
  package), on the weight shapes and row counts where they were measured faster.
- "cublas": torch._scaled_mm blockwise (Hopper, torch >= 2.9, verified shapes).
- "triton prefill": fp8_block_gemm_kernel, row-tiled; everywhere (the last resort).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from quantroll.kernels import fp8_gemv
from quantroll.kernels.scaled_mm import scaled_mm_supports, scaled_mm_verified_on

KERNELS = ("cuda decode", "triton decode", "cutlass", "cublas", "triton prefill")


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
class CutlassTiles:
    """A CUTLASS configuration (cutlass_gemm.CONFIGS, by name) and its K splits (stream-K
    configs: 0 CUTLASS's heuristic, 1 none, s > 1 split-K into s)."""

    config: str
    splits: int = 0


@dataclass(frozen=True)
class GemmRow:
    """Products of ``min_m`` ... ``max_m`` rows (on weights of ``weight_shape`` = (N, K) only,
    where given) take ``kernel`` with ``tiles``; ``measured`` says which figure chose it."""

    kernel: str
    min_m: int = 1
    max_m: int = 1 << 62
    tiles: DecodeGemmConfig | PrefillGemmConfig | CutlassTiles | None = None
    weight_shape: tuple[int, int] | None = None
    measured: str = ""

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"GemmRow.kernel must be one of {KERNELS}, got {self.kernel!r}")
        wants = {"triton decode": DecodeGemmConfig, "triton prefill": PrefillGemmConfig,
                 "cutlass": CutlassTiles}.get(self.kernel)
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
    if kernel == "cutlass":
        from quantroll.kernels import cutlass_gemm  # builds the library at the first question

        return k % 128 == 0 and n % 128 == 0 and cutlass_gemm.available(device)
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

# CUTLASS where it beat the kernel the table gave before by >= 3% (bench/gemm_cutlass.py,
# H100 80GB, 2026-12-06; graph replays over 8 weights; the Qwen3-8B and 1.7B layer shapes;
# a row covers the row counts from the previous measured M up to its own): one layer's four
# GEMMs on 8B at M = 64 / 128 / 256 took 88.5 / 96.9 / 111.3 us against 118.1 / 110.1 /
# 118.9 before (roofline 66.3 / 68.5 / 75.8 us).
H100_CUTLASS = "bench/gemm_cutlass.py, H100 80GB, 2026-12-06"
CUTLASS_ROWS = tuple(
    GemmRow("cutlass", min_m=lo, max_m=hi, weight_shape=shape, tiles=CutlassTiles(cfg, splits), measured=H100_CUTLASS)
    for shape, lo, hi, cfg, splits in (
        # Qwen3-8B: fused q/k/v, o, fused gate/up, down
        ((6144, 4096), 17, 32, "swap-128x16-sk", 1),
        ((6144, 4096), 33, 128, "64x128-pingpong", 0),
        ((4096, 4096), 17, 64, "swap-128x16-sk", 1),
        ((4096, 4096), 65, 128, "swap-128x32-sk", 0),
        ((4096, 4096), 129, 256, "64x128-pingpong", 0),
        ((24576, 4096), 17, 32, "swap-128x16-sk", 1),
        ((24576, 4096), 33, 64, "swap-128x32-sk", 1),
        ((24576, 4096), 257, 512, "128x128-c1x2-sk", 0),
        ((4096, 12288), 17, 64, "swap-128x16-sk", 1),
        ((4096, 12288), 65, 128, "swap-128x32-sk", 0),
        ((4096, 12288), 129, 256, "64x128-pingpong", 0),
        # Qwen3-1.7B
        ((4096, 2048), 17, 32, "swap-128x16-sk", 1),
        ((4096, 2048), 33, 64, "swap-128x16-sk", 0),
        ((4096, 2048), 65, 128, "swap-128x32-sk", 0),
        ((4096, 2048), 129, 256, "64x128-pingpong", 0),
        ((2048, 2048), 33, 64, "swap-128x16-sk", 1),
        ((2048, 2048), 65, 128, "swap-128x32-sk", 1),
        ((2048, 2048), 129, 512, "64x128-pingpong", 0),
        ((12288, 2048), 17, 32, "swap-128x32-sk", 0),
        ((12288, 2048), 33, 64, "swap-128x64-sk", 1),
        ((2048, 6144), 33, 64, "swap-128x16-sk", 1),
        ((2048, 6144), 65, 128, "swap-128x32-sk", 2),
        ((2048, 6144), 129, 512, "64x128-pingpong", 0),
    ))

FP8_GEMMS = GemmPlan((
    GemmRow("cuda decode", max_m=16, measured="bench/gemv_cuda.py"),
    *CUTLASS_ROWS,
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


def describe_choices(plan: GemmPlan, shapes: dict[str, tuple[int, int]], device: torch.device,
                     max_rows: int = 8192) -> dict[str, str]:
    """Per named weight shape (N, K), which kernel ``plan`` gives each range of rows on
    ``device`` up to ``max_rows``, as one line ("1-16 cuda decode; 17-32 cutlass
    swap-128x16-sk; ..."): what an engine logs once, so a run says which GEMMs it ran (and
    asking builds a kernel library that builds at first use before any graph is captured)."""
    bounds = sorted({1, *(r.min_m for r in plan.rows), *(r.max_m + 1 for r in plan.rows if r.max_m < max_rows)})
    out = {}
    for name, (n, k) in shapes.items():
        parts: list[tuple[int, int, str]] = []
        for lo, hi in zip(bounds, [*bounds[1:], max_rows + 1]):
            row = plan.choose(lo, n, k, device)
            what = row.kernel + (f" {row.tiles.config}" if isinstance(row.tiles, CutlassTiles) else "")
            if parts and parts[-1][2] == what:
                parts[-1] = (parts[-1][0], hi - 1, what)
            else:
                parts.append((lo, hi - 1, what))
        out[name] = "; ".join(f"{lo}-{hi if hi < max_rows else ''} {what}" for lo, hi, what in parts)
    return out

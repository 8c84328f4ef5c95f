"""Every kernel choice of the GPU forward, as one frozen value.

The engine and the trainer hold a ``KernelConfig`` (model/kernel_config.py); its ``gpu``
field is this: which FP8 GEMM each product takes (the measured table), whether the norms
and silu*up hand the next FP8 linear its input already quantized, the norm kernel's warps,
the paged-attention tiles per KV cache dtype, and the CUDA decode GEMM's early launch.
A bench or a test that wants another choice builds another value (``dataclasses.replace``)
and gives it to an engine; nothing is switched module-wide, and an engine's stats say
which value it ran (``describe``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from quantroll.kernels.gemm_plan import FP8_GEMMS, GemmPlan
from quantroll.kernels.paged_attention import PagedTiles

PRODUCERS = ("norm", "silu")  # kernels that can release the decode GEMM they feed


@dataclass(frozen=True)
class EngineKernels:
    """fp8_gemms: the GEMM table. fuse_activation_quant: producers emit FP8 codes for the
    next block-FP8 linear (bit-identical to its own quantization; off: one launch more).
    norm_warps: warps per row of add_rmsnorm, the same for BF16 and FP8 output (the RMS
    reduction order follows them; H200, 2026-12-01, a bench now in git history: FP8 out
    3.71 -> 3.28 us at 16 rows with 16 warps instead of 8, BF16 a tie). attention_bf16 /
    attention_fp8: paged-attention tiles per KV cache dtype (bench/paged_attention.py
    --sweep, H200: BF16 64 keys / 3 stages at 1.0x its bytes from batch 64 (2026-12-02); FP8:
    the CUDA kernel (paged_decode_cuda.py), its warps and splits by its rule per batch: on 8B
    heads 1.08-1.15x its bytes from batch 64 where the Triton tiles read 1.23-1.33x, 1.49x
    against 1.77x at 16 x 2048 (H100, 2026-12-06). attention_fp8_triton: the Triton tiles the
    FP8 cache takes where the CUDA kernel cannot run (``without_cuda_attention``; 128 keys, 3
    stages, values positions-minor: 1.5x on an H200, 2026-12-03). early_launch: the CUDA
    decode GEMM requests its first weight bytes while the kernel before it finishes
    (programmatic dependent launch), and ``releasing_producers`` let it start at theirs; the
    CUTLASS GEMMs are launched the same way (their loads wait for the kernel before them)."""

    fp8_gemms: GemmPlan = FP8_GEMMS
    fuse_activation_quant: bool = True
    norm_warps: int = 16
    attention_bf16: PagedTiles = PagedTiles()
    attention_fp8: PagedTiles = PagedTiles(decode_kernel="cuda", decode_warps=None, decode_block_s=128,
                                           decode_stages=3)
    attention_fp8_triton: PagedTiles = PagedTiles(decode_block_s=128, decode_stages=3)
    early_launch: bool = True
    releasing_producers: frozenset = field(default_factory=lambda: frozenset(PRODUCERS))

    def __post_init__(self):
        unknown = set(self.releasing_producers) - set(PRODUCERS)
        if unknown:
            raise ValueError(f"EngineKernels.releasing_producers: unknown {sorted(unknown)}; known: {PRODUCERS}")
        if self.norm_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"EngineKernels.norm_warps must be a power of two up to 32, got {self.norm_warps}")
        if self.attention_fp8_triton.decode_kernel != "triton":
            raise ValueError("EngineKernels.attention_fp8_triton must be Triton tiles (the CUDA kernel's fallback)")

    def without_cuda_attention(self) -> "EngineKernels":
        """These choices with the FP8 cache's decode on the Triton tiles (where the CUDA kernel
        cannot run, or to compare against it)."""
        return dataclasses.replace(self, attention_fp8=self.attention_fp8_triton)

    def attention_tiles(self, fp8_cache: bool) -> PagedTiles:
        return self.attention_fp8 if fp8_cache else self.attention_bf16

    @property
    def cuda_decode_rows(self) -> int:
        """The most rows the table gives the CUDA decode GEMM (0: it never runs)."""
        return max((row.max_m for row in self.fp8_gemms.rows if row.kernel == "cuda decode"), default=0)

    def describe(self) -> dict:
        """What an engine's stats record: every field but the table as values, the table as
        (kernel, rows, weight shape) lines."""
        return {"fp8_gemms": [(r.kernel, r.min_m, r.max_m if r.max_m < 1 << 62 else None, r.weight_shape)
                              for r in self.fp8_gemms.rows],
                "fuse_activation_quant": self.fuse_activation_quant, "norm_warps": self.norm_warps,
                "attention_bf16": vars(self.attention_bf16), "attention_fp8": vars(self.attention_fp8),
                "attention_fp8_triton": vars(self.attention_fp8_triton),
                "early_launch": self.early_launch, "releasing_producers": sorted(self.releasing_producers)}


DEFAULT_ENGINE_KERNELS = EngineKernels()

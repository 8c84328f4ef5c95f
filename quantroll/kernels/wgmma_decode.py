"""The block-FP8 decode GEMM for 17-64 rows on Hopper's float16 warpgroup MMA, its weights
streamed by bulk asynchronous copies (cuda/wgmma_decode.cu, sm_90a).

Same contract as the other decode GEMMs (fp8_gemv.py, fp8_linear.fp8_gemm_decode): codes
[M, K] e4m3 with 1x128 scales, weight codes [N, K] with 128x128 scales, BF16 output,
float32-accurate (exact float16 products of the codes, float32 sums), the same result on
every run. Blocks of 64 weight rows; K split over blocks where N alone gives too few,
the splits' float32 partials added in split order by a second launch.

``fp8_linear.gemm_path`` takes it for ``FROM_M`` <= M <= 64 where it can run (0: off).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.kernels import cuda_jit, fp8_gemv

SOURCE = "wgmma_decode.cu"
MAX_M = 64  # the kernel's token tile
ROWS = 64  # weight rows per block

# Decode GEMMs of FROM_M..MAX_M rows take this kernel where it can run; 0: off.
FROM_M = 0


@dataclass(frozen=True)
class WgmmaConfig:
    """Weight stages in flight per block, 128-wide K groups per stage (one bulk copy per
    weight row and stage), K groups per split, and the resident blocks per multiprocessor
    the kernel's registers are capped for."""

    stages: int
    groups_per_stage: int
    groups_per_split: int
    min_blocks: int = 2

    @property
    def kernel(self) -> str:
        return f"wgmma_decode_s{self.stages}_g{self.groups_per_stage}_b{self.min_blocks}"

    @property
    def shared_bytes(self) -> int:
        """cuda/wgmma_decode.cu's Layout::BYTES."""
        stage = ROWS * (self.groups_per_stage * 128 + 16)
        return self.stages * stage + 2 * 16384 + 2 * 64 * 4 + 2 * self.stages * 8


# The compiled (stages, groups per stage, blocks per SM) (cuda/wgmma_decode.cu instantiates them; a test checks).
VARIANTS = ((4, 1, 2), (6, 1, 2), (3, 2, 2), (4, 2, 2), (4, 1, 3), (3, 1, 3))

# Blocks a launch should have, to keep every SM's weight stream busy (132 on the H200),
# and the variant a call takes by default (bench/wgmma_decode.py times the others).
TARGET_BLOCKS = 264
DEFAULT_VARIANT = (4, 1, 2)


def default_config(n: int, k: int, stages: int | None = None, groups_per_stage: int | None = None,
                   min_blocks: int | None = None) -> WgmmaConfig:
    """K split until ``TARGET_BLOCKS`` blocks (whole 128-groups per split); the variant's
    parameters left None come from ``DEFAULT_VARIANT``."""
    groups = k // 128
    tiles = n // ROWS
    splits = min(groups, max(1, -(-TARGET_BLOCKS // tiles)))
    s, g, b = DEFAULT_VARIANT
    return WgmmaConfig(stages or s, groups_per_stage or g, -(-groups // splits), min_blocks or b)


def supports_shape(m: int, n: int, k: int, out_dtype: torch.dtype = torch.bfloat16) -> bool:
    return out_dtype == torch.bfloat16 and 1 <= m <= MAX_M and k % 128 == 0 and k > 0 and n % ROWS == 0 and n > 0


def supports(aq: torch.Tensor, wq: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """``supports_shape`` and fp8_gemv.rows_loadable (16-byte loads and copies)."""
    return supports_shape(aq.shape[0], wq.shape[0], aq.shape[1], out_dtype) and fp8_gemv.rows_loadable(aq, wq)


def usable(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: an sm_90 GPU (the cubin is sm_90a), nvcc,
    and a successful build (cuda_jit.usable: decided once per device, and logged)."""
    return cuda_jit.usable(SOURCE, device, "FP8 decode GEMM, 17-64 rows", "Triton kernel", arch_specific=True)


def wgmma_decode(aq, a_s, wq, w_s, cfg: WgmmaConfig | None = None, out: torch.Tensor | None = None,
                 early: bool | None = None) -> torch.Tensor:
    """y [M, N] bf16 = (aq * a_s) @ (wq * w_s)^T; ``supports(aq, wq, bf16)`` must hold."""
    m, k = aq.shape
    n = wq.shape[0]
    if not supports(aq, wq, torch.bfloat16) or (out is not None and out.stride(1) != 1):
        raise ValueError(f"wgmma_decode: codes {tuple(aq.shape)} x weights {tuple(wq.shape)}: the kernel needs 1-64 "
                         "rows, whole 128-wide K groups, N a multiple of 64, rows contiguous and 16-byte aligned")
    cfg = cfg or default_config(n, k)
    if (cfg.stages, cfg.groups_per_stage, cfg.min_blocks) not in VARIANTS:
        raise ValueError(f"wgmma_decode: {cfg} is not compiled (VARIANTS)")
    splits = -(-(k // 128) // cfg.groups_per_split)
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    partial = torch.empty(splits, m, n, dtype=torch.float32, device=aq.device) if splits > 1 else y
    module = cuda_jit.load(SOURCE, aq.device, arch_specific=True)
    early = fp8_gemv.EARLY_LAUNCH if early is None else early
    module.launch(cfg.kernel, (n // ROWS, splits, 1), (160, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), wq, wq.stride(0), w_s, w_s.stride(0),
                  w_s.stride(1), y, y.stride(0), partial, m, k, cfg.groups_per_split, early=early,
                  shared_bytes=cfg.shared_bytes)
    if splits > 1:
        module.launch("wgmma_decode_reduce", (-(-(m * n) // 256), 1, 1), (256, 1, 1), partial, splits, m, n, y,
                      y.stride(0))
    return y

"""The block-FP8 decode GEMM for 17-64 rows on Hopper's float16 warpgroup MMA
(cuda/fp8_wgmma.cu, sm_90a).

Same contract as the other decode GEMMs (fp8_gemv.py, fp8_linear.fp8_gemm_decode): codes
[M, K] e4m3 with 1x128 scales, weight codes [N, K] with 128x128 scales, BF16 output,
float32-accurate (exact float16 products of the codes, float32 sums), the same result on
every run. Blocks of 64 (or 128) weight rows; K split over blocks where N alone gives too
few, the splits' float32 partials added in split order by a second launch.

Off (``FROM_M = 0``): a first version was correct on the H200 but slower than the Triton
decode GEMM (2026-12-01, docs/PERFORMANCE.md); the current one (deeper pipelines) has not
run on a GPU yet: tests/kernels/test_fp8_wgmma.py, then ``python bench/wgmma_decode.py``
against the Triton kernel, which at 64 rows is bound by mma.sync throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.kernels import cuda_jit, fp8_gemv

SOURCE = "fp8_wgmma.cu"
MAX_M = 64  # the kernel's token tile

# Decode GEMMs of FROM_M..MAX_M rows take this kernel where it can run; 0: off.
FROM_M = 0


@dataclass(frozen=True)
class WgmmaConfig:
    """Warpgroups per block (64 weight rows each, sharing the block's float16 tokens), K
    groups (of 128) per split, and K groups of weights and tokens in flight per thread."""

    warpgroups: int
    groups_per_split: int
    depth: int = 1

    @property
    def kernel(self) -> str:
        return f"fp8_wgmma_wg{self.warpgroups}_d{self.depth}"

    @property
    def rows(self) -> int:
        return 64 * self.warpgroups


# The compiled (warpgroups, depth) pairs (cuda/fp8_wgmma.cu instantiates them; a test checks).
VARIANTS = ((1, 1), (1, 2), (1, 3), (2, 2))  # 4 in flight: 255 registers and a spill

# Blocks a launch should have, to keep every SM's weight stream busy (132 on the H200).
TARGET_BLOCKS = 264


def default_config(n: int, k: int, warpgroups: int = 1, depth: int = 1) -> WgmmaConfig:
    """K split until ``TARGET_BLOCKS`` blocks (whole 128-groups per split). One warpgroup
    and one K group in flight per thread by default: at ~165 registers three such blocks
    fit an SM, so the 384 blocks of an 8B gate_up are all resident at once (2-3 groups in
    flight take 206-246 registers: two blocks per SM). Two warpgroups per block (the
    float16 tokens serve 128 rows) and the deeper pipelines are variants for
    bench/wgmma_decode.py. Measured 2026-12-01 (a first version with one group in flight):
    correct, but slower than the Triton kernel (135.6 against 104.7 us per 8B layer set at
    M = 64); the deeper pipelines are not yet timed."""
    groups = k // 128
    tiles = n // (64 * warpgroups)
    splits = min(groups, max(1, -(-TARGET_BLOCKS // tiles)))
    return WgmmaConfig(warpgroups, -(-groups // splits), depth)


def supports_shape(m: int, n: int, k: int, out_dtype: torch.dtype = torch.bfloat16) -> bool:
    return out_dtype == torch.bfloat16 and 1 <= m <= MAX_M and k % 128 == 0 and k > 0 and n % 64 == 0 and n > 0


def supports(aq: torch.Tensor, wq: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """``supports_shape`` and fp8_gemv.rows_loadable (the same 16-byte loads)."""
    return supports_shape(aq.shape[0], wq.shape[0], aq.shape[1], out_dtype) and fp8_gemv.rows_loadable(aq, wq)


def usable(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: an sm_90 GPU (the cubin is sm_90a), nvcc,
    and a successful build (cuda_jit.usable: decided once per device, and logged)."""
    return cuda_jit.usable(SOURCE, device, "FP8 decode GEMM, 17-64 rows", "Triton kernel", arch_specific=True)


def fp8_wgmma(aq, a_s, wq, w_s, cfg: WgmmaConfig | None = None, out: torch.Tensor | None = None,
              early: bool | None = None) -> torch.Tensor:
    """y [M, N] bf16 = (aq * a_s) @ (wq * w_s)^T; ``supports(aq, wq, bf16)`` must hold."""
    m, k = aq.shape
    n = wq.shape[0]
    if not supports(aq, wq, torch.bfloat16) or (out is not None and out.stride(1) != 1):
        raise ValueError(f"fp8_wgmma: codes {tuple(aq.shape)} x weights {tuple(wq.shape)}: the kernel needs 1-64 "
                         "rows, whole 128-wide K groups, N a multiple of 64, rows contiguous and 16-byte aligned")
    cfg = cfg or default_config(n, k)
    if (cfg.warpgroups, cfg.depth) not in VARIANTS:
        raise ValueError(f"fp8_wgmma: {cfg} is not compiled (VARIANTS)")
    if n % cfg.rows:
        raise ValueError(f"fp8_wgmma: N = {n} is not a multiple of {cfg.kernel}'s {cfg.rows} rows")
    splits = -(-(k // 128) // cfg.groups_per_split)
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    partial = torch.empty(splits, m, n, dtype=torch.float32, device=aq.device) if splits > 1 else y
    module = cuda_jit.load(SOURCE, aq.device, arch_specific=True)
    early = fp8_gemv.EARLY_LAUNCH if early is None else early
    module.launch(cfg.kernel, (n // cfg.rows, splits, 1), (128 * cfg.warpgroups, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), wq, wq.stride(0), w_s, w_s.stride(0),
                  w_s.stride(1), y, y.stride(0), partial, m, k, cfg.groups_per_split, early=early)
    if splits > 1:
        module.launch("fp8_wgmma_reduce", (-(-(m * n) // 256), 1, 1), (256, 1, 1), partial, splits, m, n, y,
                      y.stride(0))
    return y

"""The CUDA decode GEMM with its weights brought in by bulk asynchronous copies
(cuda/fp8_gemv_bulk.cu, Hopper and newer): fp8_gemv's product, bit for bit, with a
producer warp streaming the weight rows through shared memory instead of every thread
holding its bytes in flight in registers, and persistent blocks (the pipeline fills once
per block). For up to 16 token rows.

Same contract as ``fp8_gemv.fp8_gemv``: codes [M, K] e4m3 with 1x128 scales, weight codes
[N, K] with 128x128 scales, BF16 out, float32-accurate, the same result on every run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.kernels import cuda_jit, fp8_gemv
from quantroll.kernels.fp8_gemv import rows_loadable

SOURCE = "fp8_gemv_bulk.cu"
PARTIAL_ROW = {1: 9, 2: 17}  # gemv_fragments.cuh's partial_row<MT>() = 8 * MT + 1


@dataclass(frozen=True)
class BulkConfig:
    """One compiled variant: token tiles of 8 rows (M <= 8 * token_tiles), compute warps per
    block (warp w takes K groups w, w + warps, ...; one stage holds ``warps`` groups of the
    block's 16 weight rows), stages in flight, token codes resident for all of K (copied
    once per block) or per stage; and blocks per multiprocessor wanted (0: as many as fit;
    the grid is at most that many per multiprocessor, each block walking row tiles)."""

    token_tiles: int
    warps: int
    stages: int
    resident: int
    blocks_per_sm: int = 0

    @property
    def kernel(self) -> str:
        return f"fp8_gemv_bulk_mt{self.token_tiles}_w{self.warps}_s{self.stages}_r{self.resident}"

    @property
    def threads(self) -> int:
        return 32 * (self.warps + 1)

    def shared_bytes(self, k: int) -> int:
        """cuda/fp8_gemv_bulk.cu's BulkLayout::bytes."""
        row = self.warps * 128 + 16
        token_rows = 8 * self.token_tiles
        stage = (16 + (0 if self.resident else token_rows)) * row
        tokens = token_rows * (k + 16) if self.resident else 0
        return self.stages * stage + tokens + self.warps * 16 * PARTIAL_ROW[self.token_tiles] * 4 + (2 * self.stages + 1) * 8


# Every variant cuda/fp8_gemv_bulk.cu instantiates (keep the two lists equal: a test checks).
VARIANTS = tuple(BulkConfig(*v) for v in (
    (1, 4, 4, 0), (1, 8, 2, 0), (1, 8, 3, 0), (1, 8, 4, 0), (2, 4, 2, 0), (2, 4, 3, 0), (2, 8, 2, 0), (2, 8, 3, 0),
    (2, 16, 2, 0), (2, 4, 2, 1), (2, 8, 2, 1), (2, 4, 4, 1),
))

MAX_SHARED = 227 * 1024  # per block on Hopper
_resident: dict[tuple[str, int, int | None], int] = {}  # (kernel, shared bytes, device) -> blocks per multiprocessor


# Decode GEMMs of at most this many rows take this kernel (where ``chosen`` finds a variant)
# instead of fp8_gemv's register kernel; 0: off.
MAX_M = 0

# (token tiles M needs, fp8_gemv.width_class) -> the variant taken.
CHOICE: dict[tuple[int, str], BulkConfig] = {
    (1, "narrow"): BulkConfig(1, 8, 4, 0), (1, "wide"): BulkConfig(1, 4, 4, 0),
    (2, "narrow"): BulkConfig(2, 8, 2, 0), (2, "wide"): BulkConfig(2, 4, 2, 0)}


def chosen(aq: torch.Tensor, wq: torch.Tensor) -> BulkConfig | None:
    """The variant an M-row decode GEMM takes, or None: above ``MAX_M``, a shape or layout
    the variant cannot take, or no Hopper GPU / no build."""
    m, n = aq.shape[0], wq.shape[0]
    if m > MAX_M:
        return None
    cfg = CHOICE.get((fp8_gemv.token_tiles(m), fp8_gemv.width_class(n)))
    return cfg if cfg is not None and supports(aq, wq, cfg) and usable(aq.device) else None


def supports(aq: torch.Tensor, wq: torch.Tensor, cfg: BulkConfig) -> bool:
    m, k = aq.shape
    n = wq.shape[0]
    return (1 <= m <= 8 * cfg.token_tiles and k % 128 == 0 and n % 16 == 0 and n > 0 and rows_loadable(aq, wq)
            and cfg.shared_bytes(k) <= MAX_SHARED)


def usable(device: torch.device) -> bool:
    """Hopper or newer (bulk copies, mbarrier transaction counts) and built (cuda_jit.usable)."""
    return (device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
            and cuda_jit.usable(SOURCE, device, "FP8 decode GEMM (bulk copies)", "register kernel"))


def fp8_gemv_bulk(aq, a_s, wq, w_s, cfg: BulkConfig, out: torch.Tensor | None = None,
                  early: bool | None = None) -> torch.Tensor:
    """y [M, N] bf16 = (aq * a_s) @ (wq * w_s)^T; ``supports(aq, wq, cfg)`` must hold."""
    m, k = aq.shape
    n = wq.shape[0]
    if not supports(aq, wq, cfg) or (out is not None and out.stride(1) != 1):
        raise ValueError(f"fp8_gemv_bulk: codes {tuple(aq.shape)} x weights {tuple(wq.shape)} do not fit {cfg.kernel} "
                         f"(M <= {8 * cfg.token_tiles}, whole 128-wide K groups, N a multiple of 16, rows contiguous "
                         f"and 16-byte aligned, {cfg.shared_bytes(k)} B of shared memory <= {MAX_SHARED})")
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    module = cuda_jit.load(SOURCE, aq.device)
    shared = cfg.shared_bytes(k)
    key = (cfg.kernel, shared, aq.device.index)
    if key not in _resident:
        _resident[key] = module.resident_blocks(cfg.kernel, cfg.threads, shared)
    fit = _resident[key]
    per_sm = min(fit, cfg.blocks_per_sm) if cfg.blocks_per_sm else fit
    if per_sm < 1:
        raise ValueError(f"fp8_gemv_bulk: {cfg.kernel} does not fit a multiprocessor with {shared} B of shared memory")
    sms = torch.cuda.get_device_properties(aq.device).multi_processor_count
    grid = min(n // 16, per_sm * sms)
    module.launch(cfg.kernel, (grid, 1, 1), (cfg.threads, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), wq, wq.stride(0), w_s, w_s.stride(0),
                  w_s.stride(1), y, y.stride(0), m, k, n, shared_bytes=shared,
                  early=fp8_gemv.EARLY_LAUNCH if early is None else early)
    return y

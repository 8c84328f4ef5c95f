"""The block-FP8 decode GEMM in CUDA (cuda/fp8_gemv.cu) for batches of a few rows.

Same contract as the Triton decode kernel (fp8_linear.fp8_gemm_decode): codes [M, K] e4m3
with 1x128 scales, weight codes [N, K] with 128x128 scales, BF16 output, float32-accurate
(exact float16 products of the codes, float32 sums), the same result on every run. It
reads the weights with 16-byte loads straight into mma.sync's registers and sums the K
groups of a block's warps in shared memory, so it needs no split-K scratch, counters or
second launch (see the source for the layout).

``fp8_linear.fp8_gemm`` takes it where the GEMM table (gemm_plan.py) gives it the rows,
``supports`` holds and the kernel could be built (nvcc present), and logs once which
decode path it uses.

Launched early (programmatic dependent launch, Hopper and newer): the kernels that
produce a decode GEMM's input (RMSNorm, silu*up; ``release_producers``)
release it as they start, so that its blocks request their first weight bytes while the
producer runs, then wait for it (griddepcontrol.wait) before reading the activation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from quantroll.kernels import cuda_jit

SOURCE = "fp8_gemv.cu"


@dataclass(frozen=True)
class GemvConfig:
    """One compiled variant: token tiles of 8 rows (M <= 8 * token_tiles), weight tiles of
    16 rows per block (the token codes a warp widens serve all of them), warps per block
    (each takes every warps-th K group of the block's rows), K groups per round of loads,
    and whether the next round's loads are issued before this round multiplies (two
    register buffers)."""

    token_tiles: int
    row_tiles: int
    warps: int
    unroll: int
    pipeline: int = 0

    @property
    def kernel(self) -> str:
        return f"fp8_gemv_mt{self.token_tiles}_rt{self.row_tiles}_w{self.warps}_u{self.unroll}_p{self.pipeline}"

    @property
    def rows(self) -> int:
        return 16 * self.row_tiles


# Every variant cuda/fp8_gemv.cu instantiates (keep the two lists equal: a test checks).
# Measured and removed (2026-12-01; docs/history.md, figures in the git history of docs/PERFORMANCE.md): weights staged through
# shared memory with cp.async (slower everywhere) and a whole-sector load layout (a tie).
VARIANTS = tuple(GemvConfig(*v) for v in (
    (1, 1, 8, 1, 1), (1, 2, 8, 1, 1), (1, 2, 8, 2, 0), (1, 1, 8, 2, 0), (1, 2, 4, 2, 0), (1, 2, 4, 1, 1),
    (1, 1, 8, 2, 1), (2, 1, 8, 1, 1), (2, 1, 4, 1, 1), (2, 1, 4, 2, 0), (2, 2, 8, 1, 0), (2, 1, 8, 2, 0),
    (2, 1, 8, 1, 0), (2, 2, 4, 1, 1), (2, 2, 8, 1, 1), (2, 1, 4, 2, 1), (4, 1, 4, 1, 0), (4, 1, 4, 1, 1),
    (8, 1, 4, 1, 0),
))


def token_tiles(m: int) -> int:
    return 1 if m <= 8 else 2 if m <= 16 else 4 if m <= 32 else 8


def width_class(n: int) -> str:
    """Few output rows (N <= 4096: <= 256 blocks of 16 rows for 132 multiprocessors) want
    more warps per block than many; the choice is measured per class."""
    return "narrow" if n <= 4096 else "wide"


# (token tiles M needs, width class) -> the variant (token tiles, row tiles, warps, unroll,
# pipeline) that batch size and shape class takes; it may hold more token tiles than M
# needs where that measured faster (bench/gemv_cuda.py).
# Measured 2026-12-01 over the 8B layer shapes at M = 1 and 16 (narrow: o, down; wide:
# qkv, gate_up); the 4- and 8-tile rows are the fastest of a first sweep at M = 32 / 64,
# where Triton is faster still (unused while MAX_M = 16).
CHOICE: dict[tuple[int, str], tuple[int, ...]] = {
    (1, "narrow"): (2, 1, 8, 1, 1), (1, "wide"): (1, 2, 8, 1, 1), (2, "narrow"): (2, 1, 8, 1, 1),
    (2, "wide"): (2, 1, 4, 1, 1), (4, "narrow"): (4, 1, 4, 1, 0), (4, "wide"): (4, 1, 4, 1, 0),
    (8, "narrow"): (8, 1, 4, 1, 0), (8, "wide"): (8, 1, 4, 1, 0)}


def default_config(m: int, n: int, k: int) -> GemvConfig:
    """The variant for an M-row decode GEMM: measured best for the token tiles M needs and
    N's width class (``CHOICE``); its one-row-tile twin where N is not a multiple of the
    chosen block's rows."""
    cfg = GemvConfig(*CHOICE[(token_tiles(m), width_class(n))])
    return dataclasses.replace(cfg, row_tiles=1) if n % cfg.rows else cfg


def supports_shape(m: int, n: int, k: int, out_dtype: torch.dtype = torch.bfloat16) -> bool:
    """Shapes the kernel takes: whole 128-wide K groups, 16-row weight blocks, BF16 output,
    M <= 64."""
    return out_dtype == torch.bfloat16 and 1 <= m <= 64 and k % 128 == 0 and n % 16 == 0 and n > 0


def rows_loadable(aq: torch.Tensor, wq: torch.Tensor) -> bool:
    """Rows of codes contiguous along K and 16-byte aligned: what the CUDA kernels' 16-byte
    loads need."""
    return (aq.stride(1) == 1 and wq.stride(1) == 1 and aq.stride(0) % 16 == 0 and wq.stride(0) % 16 == 0
            and aq.data_ptr() % 16 == 0 and wq.data_ptr() % 16 == 0)


def supports(aq: torch.Tensor, wq: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """``supports_shape`` and ``rows_loadable``."""
    return supports_shape(aq.shape[0], wq.shape[0], aq.shape[1], out_dtype) and rows_loadable(aq, wq)


def release_producers(device: torch.device, producer: str, kernels) -> bool:
    """Whether ``producer`` ("norm" or "silu") should release the decode GEMM it feeds at its
    start (``griddepcontrol.launch_dependents``): only when ``kernels`` (an EngineKernels)
    gives this kernel some rows, launches it early and names the producer, on Hopper or
    newer, outside Triton's interpreter (``usable`` is False there). Releasing is harmless
    for a successor launched the ordinary way (it still waits for the producer to finish).
    The producers pass it as their RELEASE constexpr."""
    if producer not in ("norm", "silu"):
        raise ValueError(f"release_producers: unknown producer {producer!r}")
    return (producer in kernels.releasing_producers and kernels.early_launch and kernels.cuda_decode_rows > 0
            and usable(device) and torch.cuda.get_device_capability(device)[0] >= 9)


def fp8_gemv(aq, a_s, wq, w_s, cfg: GemvConfig | None = None, out: torch.Tensor | None = None,
             early: bool = True) -> torch.Tensor:
    """y [M, N] bf16 = (aq * a_s) @ (wq * w_s)^T; ``supports(aq, wq, bf16)`` must hold."""
    m, k = aq.shape
    n = wq.shape[0]
    if m == 0 or n == 0:
        return out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    if not supports(aq, wq, torch.bfloat16) or (out is not None and out.stride(1) != 1):
        raise ValueError(f"fp8_gemv: codes {tuple(aq.shape)} x weights {tuple(wq.shape)}: the kernel needs whole "
                         "128-wide K groups, N a multiple of 16, M <= 64, rows contiguous and 16-byte aligned")
    cfg = cfg or default_config(m, n, k)
    if m > 8 * cfg.token_tiles or n % cfg.rows:
        raise ValueError(f"fp8_gemv: {m} x {n} does not fit {cfg.kernel} (at most {8 * cfg.token_tiles} rows, "
                         f"N a multiple of {cfg.rows})")
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    module = cuda_jit.load(SOURCE, aq.device)
    module.launch(cfg.kernel, (n // cfg.rows, 1, 1), (32 * cfg.warps, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), wq, wq.stride(0), w_s, w_s.stride(0),
                  w_s.stride(1), y, y.stride(0), m, k,
                  early=early and torch.cuda.get_device_capability(aq.device)[0] >= 9)
    return y


def usable(device: torch.device) -> bool:
    """Whether the CUDA decode GEMM can run on ``device`` (cuda_jit.usable: decided once per
    device, by building and loading it; the log says which decode GEMM the engine uses)."""
    return cuda_jit.usable(SOURCE, device, "FP8 decode GEMM", "Triton kernel")

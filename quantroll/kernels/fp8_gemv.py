"""The block-FP8 decode GEMM in CUDA (cuda/fp8_gemv.cu) for batches of a few rows.

Same contract as the Triton decode kernel (fp8_linear.fp8_gemm_decode): codes [M, K] e4m3
with 1x128 scales, weight codes [N, K] with 128x128 scales, BF16 output, float32-accurate
(exact float16 products of the codes, float32 sums), the same result on every run. It
reads the weights with 16-byte loads straight into mma.sync's registers and sums the K
groups of a block's warps in shared memory, so it needs no split-K scratch, counters or
second launch (see the source for the layout).

``fp8_linear.fp8_gemm`` takes it for M <= ``CUDA_GEMV_MAX_M`` where ``supports`` holds and
the kernel could be built (nvcc present), and logs once which decode path it uses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from quantroll.kernels import cuda_jit

log = logging.getLogger(__name__)

SOURCE = "fp8_gemv.cu"


@dataclass(frozen=True)
class GemvConfig:
    """One compiled variant: token tiles of 8 rows (M <= 8 * token_tiles), warps per block
    (each takes every warps-th K group of the block's 16 weight rows), K groups each warp
    loads before it multiplies (bytes in flight)."""

    token_tiles: int
    warps: int
    unroll: int

    @property
    def kernel(self) -> str:
        return f"fp8_gemv_mt{self.token_tiles}_w{self.warps}_u{self.unroll}"


# Every variant cuda/fp8_gemv.cu instantiates (keep the two lists equal: a test checks).
VARIANTS = tuple(GemvConfig(mt, w, u) for mt, unrolls in ((1, (2, 4)), (2, (2, 4)), (4, (1, 2)), (8, (1, 2)))
                 for w in (4, 8) for u in unrolls)


def token_tiles(m: int) -> int:
    return 1 if m <= 8 else 2 if m <= 16 else 4 if m <= 32 else 8


# token tiles -> (warps, unroll): the variant each batch size takes (bench/gemv_cuda.py).
CHOICE: dict[int, tuple[int, int]] = {1: (8, 2), 2: (8, 2), 4: (8, 1), 8: (8, 1)}


def default_config(m: int, n: int, k: int) -> GemvConfig:
    """The variant for an M-row decode GEMM: the fewest token tiles that hold M, and the
    warps and unroll measured best for them (``CHOICE``)."""
    tiles = token_tiles(m)
    return GemvConfig(tiles, *CHOICE[tiles])


def supports(aq: torch.Tensor, wq: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Shapes and layouts the kernel takes: whole 128-wide K groups, 16-row weight blocks,
    rows of codes 16-byte aligned and contiguous along K, BF16 output, M <= 64."""
    m, k = aq.shape
    n = wq.shape[0]
    return (out_dtype == torch.bfloat16 and 1 <= m <= 64 and k % 128 == 0 and n % 16 == 0
            and aq.stride(1) == 1 and wq.stride(1) == 1 and aq.stride(0) % 16 == 0 and wq.stride(0) % 16 == 0
            and aq.data_ptr() % 16 == 0 and wq.data_ptr() % 16 == 0)


# Launch early (programmatic dependent launch): the kernel requests its first weight bytes
# while the kernel before it finishes, then waits for it (griddepcontrol.wait).
EARLY_LAUNCH = True


def fp8_gemv(aq, a_s, wq, w_s, cfg: GemvConfig | None = None, out: torch.Tensor | None = None,
             early: bool | None = None) -> torch.Tensor:
    """y [M, N] bf16 = (aq * a_s) @ (wq * w_s)^T; ``supports(aq, wq, bf16)`` must hold."""
    m, k = aq.shape
    n = wq.shape[0]
    cfg = cfg or default_config(m, n, k)
    if m > 8 * cfg.token_tiles:
        raise ValueError(f"fp8_gemv: {m} rows exceed the {8 * cfg.token_tiles} of {cfg.kernel}")
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    module = cuda_jit.load(SOURCE, aq.device)
    module.launch(cfg.kernel, (n // 16, 1, 1), (32 * cfg.warps, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), wq, wq.stride(0), w_s, w_s.stride(0),
                  w_s.stride(1), y, y.stride(0), m, k,
                  early=(EARLY_LAUNCH if early is None else early) and torch.cuda.get_device_capability(aq.device)[0] >= 9)
    return y


_usable: dict[str, bool] = {}


def usable(device: torch.device) -> bool:
    """Whether the CUDA decode GEMM can run on ``device`` (decided once per device, by
    building and loading it); says in the log which decode GEMM the engine uses and why."""
    key = str(device)
    if key not in _usable:
        reason = cuda_jit.unavailable_reason(device)
        if reason is None:
            try:
                cuda_jit.load(SOURCE, device)
            except (cuda_jit.CompileError, RuntimeError, OSError) as err:
                reason = f"building {SOURCE} failed: {err}"
        if reason is None:
            log.info("FP8 decode GEMM: CUDA kernel %s on %s", SOURCE, device)
        else:
            log.warning("FP8 decode GEMM: Triton kernel (the CUDA one is unavailable: %s)", reason)
        _usable[key] = reason is None
    return _usable[key]

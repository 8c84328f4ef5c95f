"""The CUDA decode GEMM with the token codes shared by a block's row groups
(cuda/fp8_gemv_shared.cu): a block's warps form row groups x K slices, and the block reads
its token codes once for all its row groups, staged in shared memory up front or met in
L1. For up to 16 token rows.

Same contract as ``fp8_gemv.fp8_gemv``: codes [M, K] e4m3 with 1x128 scales, weight codes
[N, K] with 128x128 scales, BF16 out, float32-accurate, the same result on every run (and
the bits of fp8_gemv's one-row-tile variant with as many warps as K slices).

Prepared, not wired into the engine: ``bench/gemv_cuda.py --shared-tokens`` times it
against the shipped variants (docs/PERFORMANCE.md, session 9, says why it is the next
candidate for 16 rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.kernels import cuda_jit, fp8_gemv

SOURCE = "fp8_gemv_shared.cu"


@dataclass(frozen=True)
class SharedConfig:
    """Token tiles of 8 rows (M <= 8 * token_tiles), weight tiles of 16 rows per warp, row
    groups and K slices (warps = row groups x K slices; a block holds 16 x row tiles x row
    groups weight rows), K groups per round of weight loads, whether the next round's loads
    are issued before this round multiplies, and whether the block stages every token code
    in shared memory first (else the row groups' warps meet in L1)."""

    token_tiles: int
    row_tiles: int
    row_groups: int
    k_slices: int
    unroll: int
    pipeline: int
    staged: int

    @property
    def kernel(self) -> str:
        return (f"fp8_gemv_shared_mt{self.token_tiles}_rt{self.row_tiles}_r{self.row_groups}_k{self.k_slices}"
                f"_u{self.unroll}_p{self.pipeline}_s{self.staged}")

    @property
    def rows(self) -> int:
        return 16 * self.row_tiles * self.row_groups

    @property
    def threads(self) -> int:
        return 32 * self.row_groups * self.k_slices

    def shared_bytes(self, m: int, k: int) -> int:
        """Dynamic shared memory of a launch: the batch's token rows, K + 16 bytes each."""
        return min(m, 8 * self.token_tiles) * (k + 16) if self.staged else 0

    @property
    def twin(self) -> fp8_gemv.GemvConfig | None:
        """A register kernel variant with the same bits (as many row tiles, k_slices warps), if compiled."""
        return next((c for c in fp8_gemv.VARIANTS if (c.token_tiles, c.row_tiles, c.warps)
                     == (self.token_tiles, self.row_tiles, self.k_slices)), None)


# Every variant cuda/fp8_gemv_shared.cu instantiates (a test checks the two lists agree).
VARIANTS = tuple(SharedConfig(*v) for v in (
    (2, 1, 4, 1, 2, 1, 1), (2, 1, 8, 1, 2, 1, 1), (2, 1, 2, 1, 2, 1, 1), (2, 1, 4, 1, 4, 0, 1), (2, 1, 4, 2, 1, 1, 1),
    (2, 1, 2, 4, 1, 1, 1), (2, 2, 2, 1, 1, 1, 1), (2, 2, 4, 1, 1, 1, 1), (2, 1, 4, 1, 2, 1, 0), (2, 1, 2, 4, 1, 1, 0),
    (2, 1, 4, 2, 1, 1, 0), (2, 1, 8, 1, 1, 1, 0), (1, 2, 4, 1, 2, 1, 1), (1, 2, 2, 2, 2, 0, 0),
))

# The most dynamic shared memory a block may ask for (the H100/H200 limit is 227 KB; two
# blocks per multiprocessor need at most ~113 KB each).
MAX_SHARED_BYTES = 113 * 1024


def supports(aq: torch.Tensor, wq: torch.Tensor, cfg: SharedConfig) -> bool:
    return (fp8_gemv.supports(aq, wq, torch.bfloat16) and aq.shape[0] <= 8 * cfg.token_tiles
            and wq.shape[0] % cfg.rows == 0 and cfg.shared_bytes(*aq.shape) <= MAX_SHARED_BYTES)


def usable(device: torch.device) -> bool:
    return cuda_jit.usable(SOURCE, device, "FP8 decode GEMM (shared tokens)", "register kernel")


def fp8_gemv_shared(aq, a_s, wq, w_s, cfg: SharedConfig, out: torch.Tensor | None = None,
                    early: bool | None = None) -> torch.Tensor:
    """y [M, N] bf16 = (aq * a_s) @ (wq * w_s)^T; ``supports(aq, wq, cfg)`` must hold."""
    m, k = aq.shape
    n = wq.shape[0]
    if m == 0 or n == 0:
        return out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    if not supports(aq, wq, cfg) or (out is not None and out.stride(1) != 1):
        raise ValueError(f"fp8_gemv_shared: codes {tuple(aq.shape)} x weights {tuple(wq.shape)} do not fit "
                         f"{cfg.kernel} (M <= {8 * cfg.token_tiles}, N a multiple of {cfg.rows}, whole 128-wide K "
                         f"groups, rows contiguous and 16-byte aligned, staged tokens <= {MAX_SHARED_BYTES} bytes)")
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    module = cuda_jit.load(SOURCE, aq.device)
    early = fp8_gemv.EARLY_LAUNCH if early is None else early
    module.launch(cfg.kernel, (n // cfg.rows, 1, 1), (cfg.threads, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), wq, wq.stride(0), w_s, w_s.stride(0),
                  w_s.stride(1), y, y.stride(0), m, k, shared_bytes=cfg.shared_bytes(m, k),
                  early=early and torch.cuda.get_device_capability(aq.device)[0] >= 9)
    return y

"""The CUDA decode GEMM with the token codes loaded once per block (cuda/fp8_gemv_shared.cu):
a block's warps form row groups x K slices, and each round of K groups the block copies
those groups' token codes into shared memory once for all its row groups. For up to 16
token rows.

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
    """Token tiles of 8 rows (M <= 8 * token_tiles), row groups of 16 weight rows, K slices
    (warps = row groups x K slices), and rounds of token codes in flight."""

    token_tiles: int
    row_groups: int
    k_slices: int
    stages: int

    @property
    def kernel(self) -> str:
        return f"fp8_gemv_shared_mt{self.token_tiles}_r{self.row_groups}_k{self.k_slices}_s{self.stages}"

    @property
    def rows(self) -> int:
        return 16 * self.row_groups

    @property
    def threads(self) -> int:
        return 32 * self.row_groups * self.k_slices

    @property
    def twin(self) -> fp8_gemv.GemvConfig | None:
        """The register kernel variant with the same bits (one row tile, k_slices warps), if compiled."""
        return next((c for c in fp8_gemv.VARIANTS if (c.token_tiles, c.row_tiles, c.warps)
                     == (self.token_tiles, 1, self.k_slices)), None)


# Every variant cuda/fp8_gemv_shared.cu instantiates (a test checks the two lists agree).
VARIANTS = tuple(SharedConfig(*v) for v in (
    (2, 2, 4, 3), (2, 4, 2, 3), (2, 2, 2, 3), (2, 4, 4, 3), (2, 8, 1, 3), (2, 4, 2, 4), (1, 2, 4, 3), (1, 4, 2, 3),
))


def supports(aq: torch.Tensor, wq: torch.Tensor, cfg: SharedConfig) -> bool:
    return (fp8_gemv.supports(aq, wq, torch.bfloat16) and aq.shape[0] <= 8 * cfg.token_tiles
            and wq.shape[0] % cfg.rows == 0)


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
                         "groups, rows contiguous and 16-byte aligned)")
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=aq.device)
    module = cuda_jit.load(SOURCE, aq.device)
    early = fp8_gemv.EARLY_LAUNCH if early is None else early
    module.launch(cfg.kernel, (n // cfg.rows, 1, 1), (cfg.threads, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), wq, wq.stride(0), w_s, w_s.stride(0),
                  w_s.stride(1), y, y.stride(0), m, k,
                  early=early and torch.cuda.get_device_capability(aq.device)[0] >= 9)
    return y

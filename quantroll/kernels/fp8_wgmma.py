"""The block-FP8 decode GEMM on Hopper's warpgroup MMA for 1-64 rows: cuda/fp8_wgmma_ws.cu
(producer warps widen the tokens into an mbarrier ring, consumer warpgroups multiply).

Same contract as the other decode GEMMs (fp8_linear.fp8_gemm_decode, fp8_gemv): codes
[M, K] e4m3 with 1x128 scales, weight codes [N, K] with 128x128 scales, BF16 output,
float32-accurate (exact float16 products of the codes, float32 sums), the same result on
every run. The weights stream into registers as wgmma's A operand (widened there); the
token codes are widened into shared memory as its B operand, a tile of 16, 32 or 64 token
rows (``tokens``; rows past the batch are zero). K is split over blocks where the weight
has too few row tiles to fill the GPU; the last block of a tile adds the splits in order.

``fp8_linear.gemm_path`` takes it only for the batch ranges ``ENGINE_CONFIGS`` names; it is
empty: on the H200 no variant beats the shipped decode GEMMs yet (per Qwen3-8B layer set,
best per shape: 71.4 vs 65.7 us at 16 rows, 120.8 vs 104.2 at 64; docs/PERFORMANCE.md,
session 11). wgmma exists on sm_90a only (Hopper): ``usable`` is False on any other GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.kernels import cuda_jit, fp8_gemv
from quantroll.kernels.counters import counters

SOURCE = "fp8_wgmma_ws.cu"
TILE_COUNTERS = "wgmma split-K tiles"  # counters.py kind
_MAX_TILES = 1 << 16


@dataclass(frozen=True)
class WgmmaConfig:
    """One compiled variant and the K splits of a launch (0: ``default_splits``).
    tokens: token rows of the tile (wgmma's n: 16, 32, 64; the batch may be smaller);
    warpgroups: multiplying warpgroups per block (64 weight rows each); depth: K groups of
    weight bytes in flight per thread; min_blocks: blocks per multiprocessor its registers
    allow; producer_warps: warps widening the tokens into a ring of ``slots`` tiles."""

    tokens: int
    warpgroups: int
    depth: int
    min_blocks: int
    splits: int = 0
    producer_warps: int = 1
    slots: int = 4
    silu: bool = False  # the down_proj twin: its input is silu(gate) * up of a BF16 gate_up, quantized here
    pipelined: bool = False  # consumers keep two wgmma groups in flight (two partial accumulators)

    @property
    def kernel(self) -> str:
        kind = "pipe_" if self.pipelined else "silu_" if self.silu else ""
        return (f"fp8_wgmma_ws_{kind}n{self.tokens}_wg{self.warpgroups}_p{self.producer_warps}_d{self.depth}"
                f"_s{self.slots}_b{self.min_blocks}")

    @property
    def rows(self) -> int:
        return 64 * self.warpgroups

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups + 32 * self.producer_warps

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of a block: the kernel's Ring (per slot one K group of widened
        token rows, their scales and two mbarriers)."""
        return self.slots * (self.tokens * 128 * 2 + self.tokens * 4 + 16)


# Every variant the source instantiates (keep the lists equal: a test checks).
VARIANTS = tuple(WgmmaConfig(n, wg, d, b, 0, pw, sl) for n, wg, pw, d, sl, b in (
    (64, 2, 2, 3, 4, 1), (64, 2, 2, 2, 4, 1), (64, 2, 4, 3, 4, 1), (64, 1, 2, 3, 3, 2), (64, 1, 2, 2, 4, 2),
    (32, 2, 2, 3, 4, 1), (16, 2, 1, 3, 4, 1), (16, 2, 1, 4, 4, 1), (16, 1, 1, 4, 4, 2))) + tuple(
    WgmmaConfig(n, wg, d, b, 0, pw, sl, False, True) for n, wg, pw, d, sl, b in (
        (16, 1, 1, 4, 4, 2), (16, 2, 1, 4, 4, 1), (16, 1, 1, 2, 4, 3), (16, 1, 1, 2, 4, 4), (16, 1, 1, 2, 3, 4),
        (32, 2, 2, 2, 4, 1), (32, 1, 1, 2, 4, 3), (64, 2, 4, 2, 4, 1), (64, 1, 2, 2, 4, 1), (64, 1, 2, 2, 3, 2)))
# The down_proj twins that take a BF16 gate_up and compute silu(gate) * up and its
# quantization in their producer warps (no silu kernel launch); same arithmetic, bit for bit.
SILU_VARIANTS = tuple(WgmmaConfig(n, wg, d, b, 0, pw, sl, True) for n, wg, pw, d, sl, b in (
    (32, 2, 4, 3, 4, 1), (16, 2, 2, 3, 4, 1), (16, 1, 2, 4, 4, 2)))
DEFAULT = WgmmaConfig(64, 2, 3, 1, 0, 4, 4)  # the fastest at 64 rows (docs/PERFORMANCE.md)

# The variant each range of decode batch rows takes in the engine (fp8_linear.gemm_path),
# e.g. {(1, 16): WgmmaConfig(16, ...), (17, 64): WgmmaConfig(64, ...)}; rows outside every
# range stay on the other decode GEMMs. Empty: no variant has beaten them yet.
ENGINE_CONFIGS: dict[tuple[int, int], WgmmaConfig] = {}
# Likewise for the MLP's down_proj given its gate_up (a SILU_VARIANTS entry per range): the
# silu kernel is then not launched. Empty: off.
ENGINE_SILU_CONFIGS: dict[tuple[int, int], WgmmaConfig] = {}


def _in_range(configs: dict[tuple[int, int], WgmmaConfig], m: int) -> WgmmaConfig | None:
    for (low, high), cfg in configs.items():
        if low <= m <= high:
            return cfg
    return None


def engine_config(m: int) -> WgmmaConfig | None:
    """The variant ``ENGINE_CONFIGS`` gives M-row decode GEMMs, or None."""
    return _in_range(ENGINE_CONFIGS, m)


def silu_config(gate_up: torch.Tensor, wq: torch.Tensor) -> WgmmaConfig | None:
    """The SILU_VARIANTS entry ``ENGINE_SILU_CONFIGS`` gives a down_proj of weight codes
    ``wq`` fed by ``gate_up`` [..., 2I], where the kernel takes it (``supports_silu``), or None."""
    if not ENGINE_SILU_CONFIGS or not gate_up.is_cuda:
        return None
    cfg = _in_range(ENGINE_SILU_CONFIGS, gate_up.numel() // max(gate_up.shape[-1], 1))
    if cfg is None or not supports_silu(gate_up, wq, cfg) or not usable(gate_up.device):
        return None
    return cfg


def default_splits(tiles: int, groups: int, target: int) -> int:
    """K splits for ``tiles`` row tiles: doubled while fewer than ``target`` blocks (one
    wave: multiprocessors x resident blocks) would stream the weight and each split keeps
    at least 4 K groups."""
    split = 1
    while tiles * split < target and groups // (split * 2) >= 4:
        split *= 2
    return split


def launch_shape(m: int, n: int, k: int, cfg: WgmmaConfig, multiprocessors: int = 132) -> tuple[int, int, int]:
    """(row tiles, splits, K groups per split) of a launch on a GPU of ``multiprocessors``."""
    tiles, groups = n // cfg.rows, k // 128
    splits = cfg.splits or default_splits(tiles, groups, multiprocessors * cfg.min_blocks)
    per_split = -(-groups // min(splits, groups))
    return tiles, -(-groups // per_split), per_split


def supports_shape(m: int, n: int, k: int, out_dtype: torch.dtype = torch.bfloat16, cfg: WgmmaConfig = DEFAULT) -> bool:
    """Shapes the kernel takes: 1 to ``cfg.tokens`` rows, whole 128-wide K groups, N a
    multiple of the block's rows, BF16 output."""
    return (out_dtype == torch.bfloat16 and 1 <= m <= cfg.tokens and k % 128 == 0 and k > 0 and n > 0
            and n % cfg.rows == 0)


def supports(aq: torch.Tensor, wq: torch.Tensor, out_dtype: torch.dtype, cfg: WgmmaConfig = DEFAULT) -> bool:
    return supports_shape(aq.shape[0], wq.shape[0], aq.shape[1], out_dtype, cfg) and fp8_gemv.rows_loadable(aq, wq)


def supports_silu(gate_up: torch.Tensor, wq: torch.Tensor, cfg: WgmmaConfig) -> bool:
    """A silu twin takes a BF16 gate_up [..., 2I] with I = the weight's K (a multiple of
    128), rows contiguous and 16-byte aligned, and as many rows as its tile holds."""
    g2 = gate_up.reshape(-1, gate_up.shape[-1]) if gate_up.dim() else gate_up
    inter = g2.shape[-1] // 2
    return (cfg.silu and gate_up.dtype == torch.bfloat16 and g2.dim() == 2 and g2.shape[-1] == 2 * inter
            and inter == wq.shape[1] and supports_shape(g2.shape[0], wq.shape[0], inter, torch.bfloat16, cfg)
            and g2.stride(1) == 1 and (g2.stride(0) * 2) % 16 == 0 and g2.data_ptr() % 16 == 0
            and wq.stride(1) == 1 and wq.stride(0) % 16 == 0 and wq.data_ptr() % 16 == 0)


def fp8_wgmma_silu(gate_up: torch.Tensor, wq, w_s, cfg: WgmmaConfig, out: torch.Tensor | None = None,
                   early: bool | None = None) -> torch.Tensor:
    """y [M, N] bf16 = quantized(bf16(silu(gate)) * up) @ (wq * w_s)^T for gate_up [M, 2I]
    BF16: what ``silu_mul(gate_up, quantize=True)`` followed by ``fp8_wgmma`` gives, in one
    launch (``supports_silu`` must hold)."""
    if not supports_silu(gate_up, wq, cfg) or (out is not None and out.stride(1) != 1):
        raise ValueError(f"fp8_wgmma_silu: gate_up {tuple(gate_up.shape)} {gate_up.dtype} x weights "
                         f"{tuple(wq.shape)}: {cfg.kernel} needs BF16 [M, 2K] with K the weight's, 1-{cfg.tokens} "
                         f"rows, N a multiple of {cfg.rows}, rows contiguous and 16-byte aligned")
    g2 = gate_up.reshape(-1, gate_up.shape[-1])
    return _launch(cfg, g2, g2.stride(0) * 2, g2, 0, 0, wq, w_s, g2.shape[0], g2.shape[1] // 2, out, early)


def fp8_wgmma(aq, a_s, wq, w_s, cfg: WgmmaConfig | None = None, out: torch.Tensor | None = None,
              early: bool | None = None) -> torch.Tensor:
    """y [M, N] bf16 = (aq * a_s) @ (wq * w_s)^T; ``supports(aq, wq, bf16, cfg)`` must hold."""
    cfg = cfg or DEFAULT
    if cfg.silu or not supports(aq, wq, torch.bfloat16, cfg) or (out is not None and out.stride(1) != 1):
        raise ValueError(f"fp8_wgmma: codes {tuple(aq.shape)} x weights {tuple(wq.shape)}: {cfg.kernel} needs "
                         f"1-{cfg.tokens} rows, whole 128-wide K groups, N a multiple of {cfg.rows}, rows "
                         "contiguous and 16-byte aligned" + (" (and FP8 codes: it is a silu twin)" if cfg.silu else ""))
    return _launch(cfg, aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), wq, w_s, aq.shape[0], aq.shape[1], out,
                   early)


def _launch(cfg: WgmmaConfig, a, a_stride_bytes: int, a_s, a_s_stride_m: int, a_s_stride_g: int, wq, w_s, m: int,
            k: int, out, early) -> torch.Tensor:
    """One launch (QUANTROLL_WGMMA_PARAMS order); ``a`` is FP8 codes, or a BF16 gate_up for a
    silu twin (then K = I, its ``silu_inter``)."""
    n = wq.shape[0]
    tiles, splits, per_split = launch_shape(m, n, k, cfg, torch.cuda.get_device_properties(a.device).multi_processor_count)
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=a.device)
    if splits > 1:
        if tiles > _MAX_TILES:
            raise ValueError(f"fp8_wgmma: {tiles} row tiles exceed the {_MAX_TILES} split-K counters")
        scratch = torch.empty(splits * n * cfg.tokens, dtype=torch.float32, device=a.device)
        tile_counters = counters(TILE_COUNTERS, a.device, _MAX_TILES)
    else:
        scratch = tile_counters = y
    module = cuda_jit.load(SOURCE, a.device)
    module.launch(cfg.kernel, (tiles, splits, 1), (cfg.threads, 1, 1),
                  a, a_stride_bytes, a_s, a_s_stride_m, a_s_stride_g, wq, wq.stride(0), w_s, w_s.stride(0),
                  w_s.stride(1), y, y.stride(0), scratch, tile_counters, m, n, k, per_split, k if cfg.silu else 0,
                  early=fp8_gemv.EARLY_LAUNCH if early is None else early, shared_bytes=cfg.shared_bytes)
    return y


def usable(device: torch.device) -> bool:
    """Whether the kernels can run on ``device``: Hopper (sm_90: wgmma is not on later
    GPUs) and a successful build (cuda_jit.usable; logged once)."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return False
    return cuda_jit.usable(SOURCE, device, "FP8 decode GEMM on wgmma", "the other decode GEMMs")

"""The FP8 KV cache format: E4M3 codes with one float32 scale per token and KV head.

Each key (and value) vector of one head at one position is scaled by its own
``amax / 448`` when it is written, so no calibration is needed and a weight update
changes nothing. NeMo-RL's alternative, one scale per layer and head recalibrated at each
update, saves those 4 bytes per head and position (3% of an E4M3 head of 128) but added
~40% more logprob gap on the built-in model (0.070 against 0.050 at 256 tokens, 0.040
against 0.028 at 1024, and 20-nat outliers: bench/kv_scaling.py, docs/PERFORMANCE.md). The bytes a decode step reads per
position and head are D codes plus one scale: for head_dim 128, 132 bytes against 256 in
BF16 (x0.52). An all-zero vector stores scale 0 and dequantizes to exact zeros, like a
block-FP8 weight block.

Pure functions; the GPU kernels that write and read the cache compute the same codes
and scales (tests/engine/test_paged_attention_gpu.py).
"""

from __future__ import annotations

import torch

from quantroll.formats.elements import E4M3_MAX, to_e4m3
from quantroll.formats.fp8_block import fp8_block_scale

KV_CODE_DTYPE = torch.float8_e4m3fn


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (codes [..., D] e4m3, scales [...] float32): one scale per vector.

    A NaN element gets code 0, never the E4M3 NaN code: attention kernels read whole
    blocks, past a sequence's end included, and a NaN byte a freed block kept would survive
    its zero probability (0 * NaN). The sequence's NaN still shows where it came from: the
    hidden state that made this vector is NaN, and so are its queries and logits."""
    x32 = x.to(torch.float32)
    scale = fp8_block_scale(x32.abs().amax(dim=-1))
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    return to_e4m3(torch.nan_to_num(x32 / divisor[..., None], nan=0.0, posinf=E4M3_MAX, neginf=-E4M3_MAX)), scale


def dequantize_kv(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(codes [..., D], scales [...]) -> float32 values [..., D]."""
    return codes.to(torch.float32) * scales[..., None]


def kv_bytes_per_element(dtype: torch.dtype | str, head_dim: int) -> float:
    """Bytes one cached element takes, its share of the scale included."""
    if dtype == "fp8_e4m3" or dtype == KV_CODE_DTYPE:
        return 1.0 + 4.0 / head_dim
    return torch.finfo(dtype).bits / 8

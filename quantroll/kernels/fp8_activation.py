"""A block-FP8 activation handed between kernels, and its buffers' layout.

Its own module, below both the FP8 GEMMs (fp8_linear.py, scaled_mm.py) and the kernels that
produce quantized activations (fused.py), so that none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_GROUP = 128  # the 1x128 activation groups of block FP8


@dataclass(frozen=True)
class Fp8Activation:
    """A BF16 activation that the kernel producing it (RMSNorm, silu*up) already quantized
    per 1x128 group, bit-identical to ``quantize_activation_fp8`` on the BF16 values: the
    FP8 linear that consumes it skips its own quantization launch. ``shape`` and ``dtype``
    are those of the BF16 tensor it stands for; ``source`` is that tensor when the producer
    wrote it too (a MoE block routes on it)."""

    codes: torch.Tensor  # [M, K] float8_e4m3fn
    scales: torch.Tensor  # [M, ceil(K/128)] float32, outer-dim-major (stride (1, M))
    shape: torch.Size
    dtype: torch.dtype
    source: torch.Tensor | None = None


def fp8_activation_buffers(m: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty codes [M, K] e4m3 and scales [M, ceil(K/128)] float32 laid out outer-dim-major
    (stride (1, M)), the layout torch._scaled_mm and the Triton GEMMs read; every producer
    of an FP8 activation allocates through here."""
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=device)
    scales = torch.empty((k + 127) // 128, m, dtype=torch.float32, device=device).t()
    return codes, scales

"""One linear layer for every format: y = x W^T (+ b).

A BF16 layer holds ``weight`` as a parameter (the trainer's case). A quantized layer
holds the checkpoint's tensors as buffers, under the checkpoint's own names
(``weight`` codes, ``weight_scale`` and for NVFP4 ``weight_global``), so that a
weight update can copy into them in place, and computes through a backend:

- ``emulated``: quantize the activation per group exactly as the format defines it,
  dequantize activation and weight, multiply in float32. Exact numerics of the format
  on any device; used on CPU, on GPUs without the format, and as the reference that
  the fast kernels are tested against.
- faster backends (real FP8 GEMMs) register in ``BACKENDS`` from quantroll.kernels.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from quantroll.formats import Format, QuantizedTensor

Backend = Callable[["QLinear", torch.Tensor], torch.Tensor]
BACKENDS: dict[str, Backend] = {}


def emulated_forward(layer: "QLinear", x: torch.Tensor) -> torch.Tensor:
    fmt = layer.format
    xq = fmt.dequantize(fmt.quantize_activation(x, name=f"input of {layer.name}"))
    y = xq @ layer.dequantized_weight().t()
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.to(x.dtype)


BACKENDS["emulated"] = emulated_forward


class QLinear(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, fmt: Format | None = None,
                 name: str = "", dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None):
        super().__init__()
        self.in_features, self.out_features, self.format, self.name = in_features, out_features, fmt, name
        self.backend = "emulated"
        self._dequant_cache: torch.Tensor | None = None
        if fmt is None:
            self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
        else:
            proto = fmt.quantize_weight(torch.zeros(out_features, in_features, device=device))
            self.register_buffer("weight", torch.empty_like(proto.data))
            self.register_buffer("weight_scale", torch.empty_like(proto.scale))
            if proto.global_scale is not None:
                self.register_buffer("weight_global", torch.empty_like(proto.global_scale))
            self._block = proto.block
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @property
    def quantized(self) -> bool:
        return self.format is not None

    def quantized_weight(self) -> QuantizedTensor:
        gs = getattr(self, "weight_global", None) if self.quantized else None
        return QuantizedTensor(self.weight, self.weight_scale, self.format.name, (self.out_features, self.in_features),
                               self._block, gs)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight's float32 values (cached until the next load)."""
        if self._dequant_cache is None:
            self._dequant_cache = self.format.dequantize(self.quantized_weight())
        return self._dequant_cache

    @torch.no_grad()
    def load_quantized_(self, q: QuantizedTensor) -> None:
        """Copy a quantized weight into this layer's buffers in place (no reallocation)."""
        self.weight.copy_(q.data)
        self.weight_scale.copy_(q.scale)
        if q.global_scale is not None:
            self.weight_global.copy_(q.global_scale)
        self._dequant_cache = None

    def invalidate(self) -> None:
        """Forget derived state after the buffers were written from outside."""
        self._dequant_cache = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.format is None:
            return F.linear(x, self.weight, self.bias)
        return BACKENDS[self.backend](self, x)

    def extra_repr(self) -> str:
        fmt = self.format.name if self.format else str(self.weight.dtype).replace("torch.", "")
        return f"{self.in_features} -> {self.out_features}, {fmt}, backend={self.backend if self.format else 'torch'}"

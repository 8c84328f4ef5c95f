"""One linear layer for every format: y = x W^T (+ b).

A BF16 layer holds ``weight`` as a parameter (the trainer's case). A quantized layer
holds the checkpoint's tensors as buffers, under the checkpoint's own names
(``weight`` codes, ``weight_scale`` and for NVFP4 ``weight_global``), so that a
weight update can copy into them in place, and computes through a backend:

- ``emulated``: quantize the activation per group exactly as the format defines it,
  dequantize activation and weight, multiply in float32. Exact numerics of the format
  on any device; used on CPU, on GPUs without the format, and as the reference that
  the fast kernels are tested against.
- faster backends (real FP8 GEMMs) register in ``kernels.backends.BACKENDS``.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from quantroll.formats import Format, QuantizedTensor
from quantroll.formats.stored import DATA, GLOBAL_SCALE, SCALE
from quantroll.kernels.backends import BACKENDS
from quantroll.model import invariant
from quantroll.model.kernel_config import DEFAULT_PLAN, ForwardPlan, KernelConfig

Backend = Callable[["QLinear", torch.Tensor], torch.Tensor]


def emulated_forward(layer: "QLinear", x: torch.Tensor) -> torch.Tensor:
    fmt = layer.format
    xq = fmt.dequantize(fmt.quantize_activation(x, name=f"input of {layer.name}"))
    kernels = layer.plan.kernels
    if kernels.batch_invariant:  # the trainer's mode-2 forward computes exactly this (quantized_forward)
        y = invariant.matmul(xq, layer.dequantized_weight(), kernels).to(x.dtype)
        return y if layer.bias is None else y + layer.bias
    y = xq @ layer.dequantized_weight().t()
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.to(x.dtype)


BACKENDS["emulated"] = emulated_forward


class QLinear(torch.nn.Module):
    """How it computes (backend, kernels, the trainer's format) is read from ``plan``, the
    model's ForwardPlan (model/kernel_config.py), handed over once by CausalLM.prepare_."""

    plan: ForwardPlan = DEFAULT_PLAN

    def __init__(self, in_features: int, out_features: int, bias: bool = False, fmt: Format | None = None,
                 name: str = "", dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None):
        super().__init__()
        self.in_features, self.out_features, self.format, self.name = in_features, out_features, fmt, name
        self._dequant_cache: torch.Tensor | None = None
        self._fused_into: list[QLinear] = []
        if fmt is None:
            self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
        else:
            # the format's stored layout is its in-memory one: no placeholder is quantized, so
            # a model can be laid out on the meta device (a trainer rank's engine description)
            held = {t.role: t for t in fmt.stored_tensors((out_features, in_features))}
            for buffer, role in (("weight", DATA), ("weight_scale", SCALE), ("weight_global", GLOBAL_SCALE)):
                if role in held:
                    self.register_buffer(buffer, torch.empty(held[role].shape, dtype=held[role].dtype, device=device))
            self._block = fmt.weight_block
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @property
    def backend(self) -> str:
        """The BACKENDS entry a quantized layer computes through (the plan's choice)."""
        return self.plan.linear_backend

    @property
    def kernels(self) -> KernelConfig:
        return self.plan.kernels

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
        self.invalidate()

    @property
    def is_fused_part(self) -> bool:
        """Whether this layer's weights are views into a fused layer (q/k/v, gate/up)."""
        return bool(self._fused_into)

    def invalidate(self) -> None:
        """Forget derived state after the buffers were written from outside. Called for
        every emulated layer at every weight update: the cache (a plain attribute, never a
        parameter or buffer) is dropped past nn.Module.__setattr__'s registry checks, which
        cost ~1 us a layer (0.27 ms of a 1.7B update on the H200)."""
        if self._dequant_cache is not None:
            object.__setattr__(self, "_dequant_cache", None)
        for fused in self._fused_into:
            fused.invalidate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        if self.format is not None:
            return BACKENDS[plan.linear_backend](self, x)
        train_format = plan.train_format_of(self.name)
        if train_format is not None:  # trainer modes 2-4: the engine's quantization in the forward
            from quantroll.model.quantized_forward import quantized_forward_linear

            return quantized_forward_linear(x, self.weight, self.bias, train_format, plan.train.real_fp8, plan.kernels)
        if plan.kernels.batch_invariant:
            return invariant.linear(x, self.weight, self.bias, plan.kernels)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        fmt = self.format.name if self.format else str(self.weight.dtype).replace("torch.", "")
        return f"{self.in_features} -> {self.out_features}, {fmt}, backend={self.backend if self.format else 'torch'}"


def can_fuse(parts: list[QLinear]) -> bool:
    """Linears that read the same input can run as one GEMM when their weights stack
    along the output dimension: BF16 always, block FP8 when every part's rows fill
    whole 128-row scale blocks; formats with per-tensor scales (NVFP4) never. Biases
    (q/k/v of some families) stack too, when every part has one."""
    fmt = parts[0].format
    if any(p.format is not fmt and (p.format is None or fmt is None or p.format.name != fmt.name) for p in parts):
        return False
    if len({p.bias is None for p in parts}) > 1:
        return False
    if fmt is None:
        return True
    return fmt.can_stack([p.out_features for p in parts])


@torch.no_grad()
def fuse_linears(parts: list[QLinear], name: str) -> QLinear:
    """One QLinear over the concatenated weights (and biases); the parts become views into
    it, so in-place weight loads into a part update the fused layer (and drop its caches)."""
    first = parts[0]
    biased = first.bias is not None
    fused = QLinear(first.in_features, sum(p.out_features for p in parts), bias=biased, fmt=first.format, name=name,
                    dtype=first.weight.dtype if first.format is None else torch.bfloat16, device=first.weight.device)
    fields = ["weight"] if first.format is None else ["weight", "weight_scale"]
    fields += ["bias"] if biased else []
    for field in fields:
        parameter = field == "bias" or (field == "weight" and first.format is None)
        stacked = torch.cat([getattr(p, field).detach() for p in parts], dim=0)
        if parameter:
            setattr(fused, field, torch.nn.Parameter(stacked, requires_grad=False))
        else:
            setattr(fused, field, stacked)
        offset = 0
        for p in parts:
            rows = getattr(p, field).shape[0]
            view = stacked[offset: offset + rows]
            setattr(p, field, torch.nn.Parameter(view, requires_grad=False) if parameter else view)
            offset += rows
    for p in parts:
        p._fused_into.append(fused)
        p.invalidate()
    return fused

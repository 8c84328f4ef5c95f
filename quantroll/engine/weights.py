"""In-place weight loading for the engine (``Engine.load_weights``), all or nothing.

A weight update is the trainer telling the engine what to sample from next; an update
applied halfway (some tensors new, some old, the version unchanged) would give samples
from a model that never existed, labelled as the old one. So every entry is checked
first (known name, shape, a floating dtype for BF16 values, the layer's format for
pre-quantized ones, finite values) and only then are the tensors written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.formats import QuantizedTensor
from quantroll.formats.base import FLOAT_DTYPES, validity_flags  # the dtypes a BF16 parameter takes (cast)


@dataclass(frozen=True)
class _Entry:
    name: str
    value: torch.Tensor | QuantizedTensor
    layer: object | None  # the quantized QLinear it loads into, else None (a plain parameter)


def _pairs(named_tensors) -> list[tuple[str, object]]:
    items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise QuantrollError("load_weights takes (name, tensor) pairs or a dict of name -> tensor, got "
                                 f"{type(item).__name__}")
    return items


def _check_entry(name: str, value, linears: dict, params: dict) -> _Entry:
    module = name.removesuffix(".weight")
    if module in linears and name.endswith(".weight"):
        layer = linears[module]
        if isinstance(value, QuantizedTensor):
            fmt, shape = value.format, tuple(value.shape)
        elif isinstance(value, torch.Tensor) and value.dtype in FLOAT_DTYPES:
            fmt, shape = layer.format.name, tuple(value.shape)
        else:
            raise QuantrollError(f"load_weights: '{name}' must be a floating tensor or a {layer.format.name} "
                                 f"QuantizedTensor, got {getattr(value, 'dtype', type(value).__name__)}")
        if fmt != layer.format.name or shape != (layer.out_features, layer.in_features):
            raise QuantrollError(f"load_weights: '{name}' is {fmt} {shape}, the engine holds "
                                 f"{layer.format.name} {(layer.out_features, layer.in_features)}")
        return _Entry(name, value, layer)
    if name in params:
        target = params[name]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(target.shape):
            raise QuantrollError(f"load_weights: '{name}' does not match the engine's {tuple(target.shape)} "
                                 f"{target.dtype} parameter")
        if value.dtype not in FLOAT_DTYPES:
            raise QuantrollError(f"load_weights: '{name}' is {value.dtype}; the engine's parameter takes a floating "
                                 f"tensor ({', '.join(str(d).replace('torch.', '') for d in FLOAT_DTYPES)})")
        return _Entry(name, value, None)
    raise QuantrollError(f"load_weights: the engine has no weight named '{name}'")


def _flags(entry: _Entry) -> list[tuple[str, torch.Tensor]]:
    """(what would be wrong, 0-dim bool True where it is not) for one entry, unsynced. A
    QuantizedTensor's scales only: scanning every element code at each update would read the
    whole model again on the weight-sync path, whose quantizer already refused non-finite
    weights (the checkpoint loader checks the codes too)."""
    if isinstance(entry.value, QuantizedTensor):
        return validity_flags(entry.value, codes=False)
    return [("NaN/Inf value(s)", torch.isfinite(entry.value).all())]


def _check_finite(entries: list[_Entry]) -> None:
    """One reduction per check and one host sync per device for all of them."""
    checks: dict[torch.device, list[tuple[str, str, torch.Tensor]]] = {}
    for entry in entries:
        for what, flag in _flags(entry):
            checks.setdefault(flag.device, []).append((entry.name, what, flag))
    for found in checks.values():
        ok = torch.stack([flag for _, _, flag in found]).cpu()
        if not bool(ok.all()):
            name, what, _ = found[int((~ok).nonzero()[0])]
            raise NonFiniteError(f"load_weights: '{name}' holds {what}; nothing was loaded", tensor=name)


@torch.no_grad()
def load_weights(named_tensors: Iterable | Mapping, linears: dict, params: dict, device: torch.device) -> None:
    """Check every entry, then write them all: quantized layers take a QuantizedTensor as
    is or quantize a floating tensor with their format; plain parameters copy (and cast)
    the tensor. Raises before writing anything if an entry is wrong."""
    entries = [_check_entry(name, value, linears, params) for name, value in _pairs(named_tensors)]
    _check_finite(entries)
    for entry in entries:
        if entry.layer is None:
            params[entry.name].copy_(entry.value)
        elif isinstance(entry.value, QuantizedTensor):
            entry.layer.load_quantized_(entry.value)
        else:
            entry.layer.load_quantized_(entry.layer.format.quantize_weight(entry.value.to(device), entry.name))

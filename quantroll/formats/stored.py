"""How a format's weight is stored: the tensors that replace ``module.weight``.

A format declares its stored layout once, as data (``StoredTensor``); the checkpoint
writer and reader, the GPU quantize buffers and the engine's placeholders all derive
from it, so that a new format cannot store one thing and read back another. Formats
know nothing of checkpoints: the names here are only suffixes after ``module.``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DATA, SCALE, GLOBAL_SCALE, CONSTANT = "data", "scale", "global_scale", "constant"


@dataclass(frozen=True)
class StoredTensor:
    """One stored tensor of a quantized weight.

    suffix: the name after ``module.`` (``weight``, ``weight_scale_inv``, ...)
    dtype:  its stored dtype
    shape:  its shape for the weight being stored
    role:   which QuantizedTensor field it holds (data, scale, global_scale) or
            ``constant`` (a placeholder a reader expects, written as ``value``)
    value:  the constant's value (None for the others)
    """

    suffix: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    role: str
    value: float | None = None


@dataclass(frozen=True)
class StoredLayout:
    """The stored tensors' rules, independent of the weight's shape.

    data_dtype / scale_dtype: dtypes of the codes and of the block scales
    scale_suffix:   the block scales' name (the tensor whose presence marks a module quantized)
    elements_per_byte: codes packed in one stored element (2 for 4-bit codes), along K
    global_suffix:  the per-tensor float32 scale's name, None when the format has none
    constants:      (suffix, float32 value) placeholders written after the scales
    """

    data_dtype: torch.dtype
    scale_dtype: torch.dtype
    scale_suffix: str
    elements_per_byte: int = 1
    global_suffix: str | None = None
    constants: tuple[tuple[str, float], ...] = ()

    def tensors(self, shape: tuple[int, int], block: tuple[int, int]) -> list[StoredTensor]:
        """The stored tensors of a weight of logical ``shape`` [N, K], in the order written."""
        n, k = shape
        scales = (math.ceil(n / block[0]), math.ceil(k / block[1]))
        out = [StoredTensor("weight", self.data_dtype, (n, math.ceil(k / self.elements_per_byte)), DATA),
               StoredTensor(self.scale_suffix, self.scale_dtype, scales, SCALE)]
        if self.global_suffix is not None:
            out.append(StoredTensor(self.global_suffix, torch.float32, (), GLOBAL_SCALE))
        out += [StoredTensor(name, torch.float32, (), CONSTANT, value) for name, value in self.constants]
        return out

    def logical_shape(self, stored_shape: tuple[int, ...]) -> tuple[int, int]:
        """The weight's [N, K] from its stored codes' shape (a packed K counts twice)."""
        return (stored_shape[0], stored_shape[1] * self.elements_per_byte)

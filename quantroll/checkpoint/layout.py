"""How a QuantizedTensor is stored in a checkpoint (and how to read it back).

Each format declares its stored tensors (``Format.stored``, formats/stored.py); this
module only puts the module's name in front. The names and dtypes are the contract
with engines that already read these checkpoints (docs/checkpoints.md, "Checkpoint layouts"):

  fp8    X.weight F8_E4M3 [N, K]     X.weight_scale_inv F32 [ceil(N/128), ceil(K/128)]
  mxfp8  X.weight F8_E4M3 [N, K]     X.weight_scale_inv U8 (E8M0) [N, ceil(K/32)]
  nvfp4  X.weight U8 [N, K/2]        X.weight_scale F8_E4M3 [N, ceil(K/16)]
         X.weight_scale_2 F32 []     X.input_scale F32 []       (ModelOpt layout)

``input_scale`` is ModelOpt's static activation global scale, found by calibration.
quantroll quantizes activations dynamically (global = amax(x) / 2688 per call) and
never reads it; we write 1.0, the neutral value, only so that ModelOpt readers find
the tensor. An engine that applies it statically will quantize activations
differently from quantroll (see formats/nvfp4.NVFP4_NOTE).
"""

from __future__ import annotations

import torch

from quantroll.checkpoint.writer import PlannedTensor
from quantroll.formats import Format, QuantizedTensor


def stored_tensors(fmt: Format, module: str, shape: tuple[int, ...]) -> list[PlannedTensor]:
    """The tensors that replace ``module.weight`` of ``shape``, in the order written."""
    return [PlannedTensor(f"{module}.{t.suffix}", t.dtype, t.shape) for t in fmt.stored_tensors(tuple(shape))]


def to_stored(fmt: Format, module: str, q: QuantizedTensor) -> dict[str, torch.Tensor]:
    """The tensors to write for ``q``, keyed by name, in stored_tensors order."""
    return {f"{module}.{suffix}": t for suffix, t in fmt.to_stored(q).items()}


def scale_names(fmt: Format) -> tuple[str, ...]:
    """Suffixes (after ``module.``) of the extra tensors a quantized module has."""
    return tuple(t.suffix for t in fmt.stored_tensors((16, 32))[1:])


def from_stored(fmt: Format, module: str, tensors: dict[str, torch.Tensor]) -> QuantizedTensor:
    """Rebuild the QuantizedTensor of ``module`` from its stored tensors (checked)."""
    prefix = f"{module}."
    return fmt.from_stored({n[len(prefix):]: t for n, t in tensors.items() if n.startswith(prefix)}, module)

"""How a QuantizedTensor is stored in a checkpoint, per format (and how to read it back).

The names and dtypes are the contract with engines that already read these
checkpoints (README, "Checkpoint layouts"):

  fp8    X.weight F8_E4M3 [N, K]     X.weight_scale_inv F32 [ceil(N/128), ceil(K/128)]
  mxfp8  X.weight F8_E4M3 [N, K]     X.weight_scale_inv U8 (E8M0) [N, ceil(K/32)]
  nvfp4  X.weight U8 [N, K/2]        X.weight_scale F8_E4M3 [N, ceil(K/16)]
         X.weight_scale_2 F32 []     X.input_scale F32 []       (ModelOpt layout)

``input_scale`` is ModelOpt's static activation global scale, found by calibration.
quantroll quantizes activations dynamically (global = amax(x) / 2688 per call) and
never reads it; we write 1.0, the neutral value, only so that ModelOpt readers find
the tensor. An engine that applies it statically will quantize activations
differently from quantroll (see quant_config.NVFP4_NOTE).
"""

from __future__ import annotations

import math

import torch

from quantroll.checkpoint.writer import PlannedTensor
from quantroll.errors import QuantrollError
from quantroll.formats import Format, QuantizedTensor

NVFP4_INPUT_SCALE = 1.0


def _blocks(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


def stored_tensors(fmt: Format, module: str, shape: tuple[int, ...]) -> list[PlannedTensor]:
    """The tensors that replace ``module.weight`` of ``shape``, in the order written."""
    n, k = shape
    scales = _blocks((n, k), fmt.weight_block)
    if fmt.name == "fp8":
        return [
            PlannedTensor(f"{module}.weight", torch.float8_e4m3fn, (n, k)),
            PlannedTensor(f"{module}.weight_scale_inv", torch.float32, scales),
        ]
    if fmt.name == "mxfp8":
        return [
            PlannedTensor(f"{module}.weight", torch.float8_e4m3fn, (n, k)),
            PlannedTensor(f"{module}.weight_scale_inv", torch.uint8, scales),
        ]
    if fmt.name == "nvfp4":
        return [
            PlannedTensor(f"{module}.weight", torch.uint8, (n, math.ceil(k / 2))),
            PlannedTensor(f"{module}.weight_scale", torch.float8_e4m3fn, scales),
            PlannedTensor(f"{module}.weight_scale_2", torch.float32, ()),
            PlannedTensor(f"{module}.input_scale", torch.float32, ()),
        ]
    raise QuantrollError(f"no checkpoint layout for format '{fmt.name}'")


def to_stored(fmt: Format, module: str, q: QuantizedTensor) -> dict[str, torch.Tensor]:
    """The tensors to write for ``q``, keyed by name, in stored_tensors order."""
    if fmt.name in ("fp8", "mxfp8"):
        return {f"{module}.weight": q.data, f"{module}.weight_scale_inv": q.scale}
    if fmt.name == "nvfp4":
        return {
            f"{module}.weight": q.data,
            f"{module}.weight_scale": q.scale,
            f"{module}.weight_scale_2": q.global_scale.reshape(()).to(torch.float32),
            f"{module}.input_scale": torch.tensor(NVFP4_INPUT_SCALE, dtype=torch.float32),
        }
    raise QuantrollError(f"no checkpoint layout for format '{fmt.name}'")


def scale_names(fmt: Format) -> tuple[str, ...]:
    """Suffixes (after ``module.``) of the extra tensors a quantized module has."""
    return tuple(p.name.partition(".")[2] for p in stored_tensors(fmt, "m", (16, 32))[1:])


def from_stored(fmt: Format, module: str, tensors: dict[str, torch.Tensor]) -> QuantizedTensor:
    """Rebuild the QuantizedTensor of ``module`` from its stored tensors (checked)."""
    data = tensors[f"{module}.weight"]
    if fmt.name == "nvfp4":
        scale, gscale = tensors[f"{module}.weight_scale"], tensors[f"{module}.weight_scale_2"]
        shape = (data.shape[0], data.shape[1] * 2)  # convert never quantizes an odd K
        expect = [torch.uint8, torch.float8_e4m3fn]
    else:
        scale = tensors[f"{module}.weight_scale_inv"]
        gscale, shape = None, tuple(data.shape)
        expect = [torch.float8_e4m3fn, torch.float32 if fmt.name == "fp8" else torch.uint8]
    if data.dim() != 2 or [data.dtype, scale.dtype] != expect:
        raise QuantrollError(
            f"module '{module}' stores {data.dtype}/{scale.dtype}, not the {fmt.name} layout {expect[0]}/{expect[1]}"
        )
    if tuple(scale.shape) != _blocks(shape, fmt.weight_block):
        raise QuantrollError(
            f"module '{module}': scale shape {tuple(scale.shape)} does not match weight {shape} in "
            f"{fmt.weight_block[0]}x{fmt.weight_block[1]} blocks"
        )
    if gscale is not None:
        gscale = gscale.to(torch.float32).reshape(())
    return QuantizedTensor(data, scale, fmt.name, shape, fmt.weight_block, gscale)

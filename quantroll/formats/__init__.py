"""Number formats as pure tensor functions, by registry name.

``get_format("fp8")`` (block-wise FP8, 128x128), ``get_format("mxfp8", scale_rule=...)``
and ``get_format("nvfp4")`` all offer quantize_weight / quantize_activation /
dequantize / ulp. They run on any device torch supports; the GPU kernels in
``quantroll.kernels`` must reproduce them bit for bit.
"""

from __future__ import annotations

from quantroll.errors import QuantrollError
from quantroll.formats.base import Format, QuantizedTensor, invalid_values
from quantroll.formats.fp8_block import BlockFP8
from quantroll.formats.mxfp8 import MXFP8, SCALE_RULES
from quantroll.formats.nvfp4 import NVFP4

FORMAT_NAMES = ("fp8", "mxfp8", "nvfp4")


def get_format(name: str, scale_rule: str | None = None) -> Format:
    """The format called ``name``; ``scale_rule`` applies to MXFP8 only."""
    if name == "fp8":
        fmt: Format = BlockFP8()
    elif name == "mxfp8":
        fmt = MXFP8(scale_rule or "ceil")
    elif name == "nvfp4":
        fmt = NVFP4()
    else:
        raise QuantrollError(f"unknown format '{name}'; choose one of {', '.join(FORMAT_NAMES)}")
    if scale_rule is not None and name != "mxfp8":
        raise QuantrollError(f"--scale-rule applies to mxfp8 only, not to '{name}'")
    return fmt


__all__ = ["Format", "QuantizedTensor", "invalid_values", "BlockFP8", "MXFP8", "NVFP4", "get_format", "FORMAT_NAMES", "SCALE_RULES"]

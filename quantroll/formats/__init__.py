"""Number formats as pure tensor functions, by registry name.

``get_format("fp8")`` (block-wise FP8, 128x128), ``get_format("mxfp8", scale_rule=...)``
and ``get_format("nvfp4")`` all offer quantize_weight / quantize_activation /
dequantize / ulp, and carry their facts (stored layout, quantization_config, display
and recipe names, fused-sibling rules, hardware support: formats/base.Format). They run
on any device torch supports; the GPU kernels in ``quantroll.kernels`` must reproduce
them bit for bit. A new format is one module here plus one ``register_format`` line.
"""

from __future__ import annotations

from quantroll.formats.base import Format, QuantizedTensor, invalid_values
from quantroll.formats.fp8_block import BlockFP8
from quantroll.formats.mxfp8 import MXFP8, SCALE_RULES
from quantroll.formats.nvfp4 import NVFP4
from quantroll.formats.registry import (
    display_name,
    format_class,
    format_for_recipe,
    format_from_quantization_config,
    format_names,
    get_format,
    recipe_args,
    recipe_values,
    register_format,
    registered,
    unified_modes,
)

for _cls in (BlockFP8, MXFP8, NVFP4):
    register_format(_cls)

FORMAT_NAMES = format_names()  # the built-in formats, for the CLI's choices

__all__ = ["Format", "QuantizedTensor", "invalid_values", "BlockFP8", "MXFP8", "NVFP4", "get_format", "FORMAT_NAMES",
           "SCALE_RULES", "register_format", "registered", "format_names", "format_class", "display_name",
           "format_from_quantization_config", "recipe_args", "format_for_recipe", "recipe_values", "unified_modes"]

"""A toy format, written as a new format would be in quantroll/formats/: block INT8.

INT8 codes, one float32 scale per 1x32 block (``w ~= code * scale`` with scale =
amax / 127, 0 for an all-zero block), dynamic 1x32 activation groups. Emulated on any
device: it registers no GPU kernel, so the engine and the weight sync run it on the
reference path. tests/formats/test_toy_format.py registers it and runs it through
convert, the engine, the weight sync and the report labels, without touching any other
file: the proof that a format is one module plus one registration.
"""

from __future__ import annotations

import torch

from quantroll.formats.base import Format, QuantizedTensor, block_amax, expand_blocks
from quantroll.formats.stored import StoredLayout

INT8_MAX = 127.0


class BlockInt8(Format):
    name = "int8_b32"
    weight_block = (1, 32)
    act_group = 32
    stored = StoredLayout(torch.int8, torch.float32, "weight_scale")
    display_name = "block INT8"
    quant_method = reads_as = "quantroll_int8"

    def quantization_config(self, skipped: list[str], provenance: dict) -> dict:
        return {"quant_method": self.quant_method, "weight_block_size": list(self.weight_block),
                "modules_to_not_convert": skipped, "quantroll": provenance}

    def _quantize_2d(self, x: torch.Tensor, block: tuple[int, int]) -> QuantizedTensor:
        scale = block_amax(x, block) / INT8_MAX
        divisor = expand_blocks(torch.where(scale > 0, scale, torch.ones_like(scale)), block, tuple(x.shape))
        codes = torch.round(x / divisor).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        return QuantizedTensor(codes, scale, self.name, tuple(x.shape), block)

    def _dequantize_2d(self, q: QuantizedTensor) -> torch.Tensor:
        return q.data.to(torch.float32) * expand_blocks(q.scale, q.block, q.shape)

    def _ulp_2d(self, q: QuantizedTensor) -> torch.Tensor:
        return expand_blocks(q.scale, q.block, q.shape).expand(q.shape).clone()

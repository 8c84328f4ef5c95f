"""MXFP8 (OCP Microscaling v1.0): E4M3 elements, 32 along K share one E8M0 scale.

An E8M0 scale is a bare power of two 2**s, stored as the biased byte s + 127. Two
rules choose s for a group with largest magnitude amax = m * 2**e (1 <= m < 2):

- ``ocp``:  s = e - 8, the rule of the OCP spec (8 is E4M3's largest exponent). The
  group's largest elements can land in [448, 512) * 2**s and saturate to 448.
- ``ceil``: s = ceil(log2(amax / 448)), the rule Transformer Engine, Miles' converter
  and SGLang's kernels use: nothing saturates. Computed exactly from the bits
  (s = e - 8, plus one when m > 1.75), with no rounded division in the way.

Both are clamped to [-127, 127]; an all-zero group gets 2**-127 and zero codes. The
default is ``ceil``; the checkpoint records the rule so that a weight update
re-quantizes the way the checkpoint was made.
"""

from __future__ import annotations

import torch

from quantroll.errors import QuantrollError
from quantroll.formats.base import Format, QuantizedTensor, block_amax, expand_blocks
from quantroll.formats.stored import StoredLayout
from quantroll.formats.elements import (
    E8M0_MAX_EXP,
    E8M0_MIN_EXP,
    e4m3_ulp,
    e8m0_decode,
    e8m0_encode,
    floor_log2,
    mantissa_bits,
    pow2,
    to_e4m3,
)

SCALE_RULES = ("ceil", "ocp")
# 1.75 = 448 / 2**8: the mantissa above which 448 * 2**(e-8) < amax.
_MANTISSA_1_75 = 0x600000


def mx_scale_exponent(amax: torch.Tensor, rule: str) -> torch.Tensor:
    """The E8M0 exponent s (int32) for each group's amax under ``rule``."""
    s = floor_log2(amax) - 8
    if rule == "ceil":
        s = s + (mantissa_bits(amax) > _MANTISSA_1_75).to(torch.int32)
    elif rule != "ocp":
        raise QuantrollError(f"unknown MXFP8 scale rule '{rule}'; choose one of {', '.join(SCALE_RULES)}")
    s = s.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    return torch.where(amax > 0, s, torch.full_like(s, E8M0_MIN_EXP))


class MXFP8(Format):
    name = "mxfp8"
    weight_block = (1, 32)
    act_group = 32
    stored = StoredLayout(torch.float8_e4m3fn, torch.uint8, "weight_scale_inv")  # E8M0 scale bytes
    display_name = "MXFP8"
    recipe_flag = ("--fp8-recipe", "mxfp8")
    unified_mode = "3"
    quant_method = reads_as = "mxfp8"
    scale_rules = SCALE_RULES

    def __init__(self, scale_rule: str = "ceil"):
        if scale_rule not in SCALE_RULES:
            raise QuantrollError(f"unknown MXFP8 scale rule '{scale_rule}'; choose one of {', '.join(SCALE_RULES)}")
        self.scale_rule = scale_rule

    def __repr__(self) -> str:
        return f"MXFP8(scale_rule={self.scale_rule!r})"

    def quantization_config(self, skipped: list[str], provenance: dict) -> dict:
        """The MXFP8 block, with the scale rule so that an update re-quantizes the same way."""
        return {"quant_method": "mxfp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [1, 32],
                "scale_fmt": "ue8m0", "scale_rule": self.scale_rule, "modules_to_not_convert": skipped,
                "quantroll": provenance}

    @classmethod
    def from_quantization_config(cls, qc: dict, ours: dict, where: str) -> "MXFP8":
        # A checkpoint made elsewhere does not record its rule; Miles/TE/SGLang round up.
        return cls(qc.get("scale_rule") or ours.get("scale_rule") or "ceil")

    def _quantize_2d(self, x: torch.Tensor, block: tuple[int, int]) -> QuantizedTensor:
        s = mx_scale_exponent(block_amax(x, block), self.scale_rule)
        inverse = expand_blocks(pow2(-s), block, tuple(x.shape))  # exact power of two
        codes = to_e4m3(x * inverse)
        return QuantizedTensor(codes, e8m0_encode(s), self.name, tuple(x.shape), block)

    def _dequantize_2d(self, q: QuantizedTensor) -> torch.Tensor:
        return q.data.to(torch.float32) * expand_blocks(e8m0_decode(q.scale), q.block, q.shape)

    def _ulp_2d(self, q: QuantizedTensor) -> torch.Tensor:
        return e4m3_ulp(q.data.to(torch.float32)) * expand_blocks(e8m0_decode(q.scale), q.block, q.shape)

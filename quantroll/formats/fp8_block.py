"""Block-wise FP8 (DeepSeek-V3 / Qwen3-*-FP8 layout).

Weights: E4M3 codes, one float32 scale per 128x128 block. Activations: one scale per
token per 1x128 group, computed at run time. The stored scale is the multiplier that
dequantizes (checkpoints call it ``weight_scale_inv``): ``w ~= q * scale`` with
``scale = amax(block) / 448``, so the block's largest element maps onto 448 exactly.

An all-zero block stores scale 0 and codes 0, so it dequantizes to exact zeros (a
converter that divides by that zero writes NaN). A block whose amax/448 would
underflow float32 stores the smallest normal float32 instead, so that nothing
divides by zero and the half-ULP bound still holds at the stored scale.
"""

from __future__ import annotations

import torch

from quantroll.errors import QuantrollError
from quantroll.formats.base import Format, QuantizedTensor, block_amax, expand_blocks
from quantroll.formats.stored import StoredLayout
from quantroll.formats.elements import E4M3_MAX, FP32_TINY, div_exact, e4m3_ulp, to_e4m3


def fp8_block_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448 (float32, correctly rounded); 0 for an all-zero block."""
    scale = div_exact(amax, E4M3_MAX).clamp(min=FP32_TINY)
    return torch.where(amax > 0, scale, torch.zeros_like(scale))


class BlockFP8(Format):
    name = "fp8"
    weight_block = (128, 128)
    act_group = 128
    stored = StoredLayout(torch.float8_e4m3fn, torch.float32, "weight_scale_inv")
    display_name = "block FP8"
    recipe_flag = ("--fp8-recipe", "blockwise")
    unified_mode = "2"
    quant_method = reads_as = "fp8"
    fused_gemm = True  # q/k/v and gate/up stack when their rows fill 128-row blocks
    emulated_only = False  # FP8 tensor-core GEMMs on Hopper (quantroll.kernels)

    def quantization_config(self, skipped: list[str], provenance: dict) -> dict:
        """DeepSeek-V3 / Qwen3-FP8's block: what vLLM, SGLang and transformers read."""
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128], "modules_to_not_convert": skipped, "quantroll": provenance}

    @classmethod
    def from_quantization_config(cls, qc: dict, ours: dict, where: str) -> "BlockFP8":
        raw_block = qc.get("weight_block_size") or []
        if not isinstance(raw_block, list):
            raise QuantrollError(f"{where}: quantization_config.weight_block_size must be a list like [128, 128], "
                                 f"got {raw_block!r}")
        block = list(raw_block)
        if block != [128, 128] or qc.get("fmt", "e4m3") != "e4m3":
            raise QuantrollError(
                f"{where}: fp8 checkpoint with weight_block_size {block or None} and fmt {qc.get('fmt')!r}; "
                "quantroll reads block-wise e4m3 with [128, 128] blocks only"
            )
        return cls()

    def _quantize_2d(self, x: torch.Tensor, block: tuple[int, int]) -> QuantizedTensor:
        scale = fp8_block_scale(block_amax(x, block))
        divisor = expand_blocks(torch.where(scale > 0, scale, torch.ones_like(scale)), block, tuple(x.shape))
        codes = to_e4m3(x / divisor)
        return QuantizedTensor(codes, scale, self.name, tuple(x.shape), block)

    def _dequantize_2d(self, q: QuantizedTensor) -> torch.Tensor:
        return q.data.to(torch.float32) * expand_blocks(q.scale, q.block, q.shape)

    def _ulp_2d(self, q: QuantizedTensor) -> torch.Tensor:
        return e4m3_ulp(q.data.to(torch.float32)) * expand_blocks(q.scale, q.block, q.shape)

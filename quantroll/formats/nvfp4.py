"""NVFP4: E2M1 elements in 1x16 groups, an E4M3 scale per group, an FP32 scale per tensor.

Two levels, as NVIDIA's ModelOpt computes them:
    global = amax(tensor) / (448 * 6)                       (float32)
    s      = e4m3(amax(group) / 6 / global)                 (per group, saturated at 448)
    code   = e2m1(x / (s * global))                         (nearest even, saturated at 6)
    x     ~= code * s * global
Codes are packed two per byte, element 2i in the low nibble (ModelOpt's order).

The E4M3 group scale is itself rounded, so it can land below amax/6/global; the
largest element then lands a little above 6 and rounds back to 6, still within half
an ULP at the stored scale. A nonzero group whose scale would underflow E4M3 stores
the smallest subnormal (2**-9) instead of 0. An all-zero group stores scale 0; an
all-zero tensor stores global 1. Activations get a dynamic per-tensor global.
"""

from __future__ import annotations

import torch

from quantroll.errors import QuantrollError
from quantroll.version import __version__
from quantroll.formats.base import Format, QuantizedTensor, block_amax, check_input, expand_blocks
from quantroll.formats.stored import StoredLayout
from quantroll.formats.elements import (
    E2M1_MAX,
    E4M3_MAX,
    E4M3_MIN_SUBNORMAL,
    FP32_TINY,
    div_exact,
    e2m1_decode,
    e2m1_encode,
    e2m1_ulp,
    pack_nibbles,
    to_e4m3,
    unpack_nibbles,
)


# ModelOpt's static activation global scale, found by calibration. quantroll quantizes
# activations dynamically (global = amax(x) / 2688 per call) and never reads it; it writes
# 1.0, the neutral value, only so that ModelOpt readers find the tensor.
NVFP4_INPUT_SCALE = 1.0
NVFP4_NOTE = (
    "weights use the ModelOpt NVFP4 layout with weight_scale_2 shared within fused q/k/v and gate/up; "
    "input_scale is a placeholder 1.0: quantroll quantizes activations dynamically (global amax/2688 per call) "
    "and ignores it, while engines that apply it as a static calibrated scale (vLLM/SGLang ModelOpt path) will "
    "quantize activations differently, so only quantroll reproduces quantroll's NVFP4 numerics"
)


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax / 2688 as float32 (1.0 for an all-zero tensor; never below the smallest
    normal float32, so that the group scales stay finite for subnormal amaxes)."""
    amax = amax.to(torch.float32)
    global_scale = div_exact(amax, E4M3_MAX * E2M1_MAX).clamp(min=FP32_TINY)
    return torch.where(amax > 0, global_scale, torch.ones_like(amax))


def nvfp4_group_scale(group_amax: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """E4M3 group scales: e4m3(amax / 6 / global), never 0 for a nonzero group."""
    s = to_e4m3(div_exact(group_amax, E2M1_MAX) / global_scale)
    tiny = torch.full_like(group_amax, E4M3_MIN_SUBNORMAL).to(torch.float8_e4m3fn)
    underflow = (s.to(torch.float32) == 0) & (group_amax > 0)
    return torch.where(underflow, tiny, s)


class NVFP4(Format):
    name = "nvfp4"
    weight_block = (1, 16)
    act_group = 16
    stored = StoredLayout(torch.uint8, torch.float8_e4m3fn, "weight_scale", elements_per_byte=2,
                          global_suffix="weight_scale_2", constants=(("input_scale", NVFP4_INPUT_SCALE),))
    display_name = "NVFP4"
    recipe_flag = ("--fp4-recipe", "nvfp4")
    unified_mode = "4"
    quant_method, reads_as = "modelopt", "modelopt NVFP4"
    batch_dependent_activations = True  # the dynamic global scale is one amax over the whole activation
    shared_global_scale = True  # vLLM/SGLang keep one weight_scale_2 per fused q/k/v and gate/up GEMM

    def quantization_config(self, skipped: list[str], provenance: dict) -> dict:
        """ModelOpt's NVFP4 block (the ``exclude_modules`` spelling of the kept modules)."""
        provenance = {**provenance, "activation_scheme": "dynamic", "input_scale": NVFP4_INPUT_SCALE, "note": NVFP4_NOTE}
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                "exclude_modules": skipped, "producer": {"name": "quantroll", "version": __version__},
                "quantroll": provenance}

    def sidecar_files(self, qc: dict) -> dict[str, dict]:
        """ModelOpt's separate hf_quant_config.json, which older vLLM reads."""
        return {"hf_quant_config.json": {"producer": qc["producer"], "quantization": {
            "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": qc["exclude_modules"]}}}

    @classmethod
    def from_quantization_config(cls, qc: dict, ours: dict, where: str) -> "NVFP4":
        algo = qc.get("quant_algo")
        if algo != "NVFP4" or qc.get("group_size", 16) != 16:
            raise QuantrollError(f"{where}: modelopt quant_algo {algo!r}; quantroll reads NVFP4 with group_size 16 only")
        return cls()

    def quantize_weight(self, w: torch.Tensor, name: str = "weight", global_amax: torch.Tensor | None = None) -> QuantizedTensor:
        """As Format.quantize_weight; ``global_amax`` shares one global scale across the
        shards of a fused layer (q/k/v, gate/up), as ModelOpt exports them: engines that
        fuse those layers keep a single ``weight_scale_2`` for the fused weight."""
        check_input(w, name, weight=True)
        x = w.to(torch.float32)
        if global_amax is not None:
            global_amax = torch.as_tensor(global_amax, dtype=torch.float32, device=x.device)
            if bool(global_amax < x.abs().amax()):
                raise QuantrollError(f"tensor '{name}': the shared global amax {float(global_amax):g} is below the tensor's own amax")
        return self._quantize_2d(x, self.weight_block, global_amax)

    def _quantize_2d(self, x: torch.Tensor, block: tuple[int, int], global_amax: torch.Tensor | None = None) -> QuantizedTensor:
        global_scale = nvfp4_global_scale(x.abs().amax() if global_amax is None else global_amax)
        s = nvfp4_group_scale(block_amax(x, block), global_scale)
        step = s.to(torch.float32) * global_scale
        divisor = expand_blocks(torch.where(step > 0, step, torch.ones_like(step)), block, tuple(x.shape))
        codes = e2m1_encode(x / divisor)
        return QuantizedTensor(pack_nibbles(codes), s, self.name, tuple(x.shape), block, global_scale)

    def _step(self, q: QuantizedTensor) -> torch.Tensor:
        return expand_blocks(q.scale.to(torch.float32) * q.global_scale, q.block, q.shape)

    def codes(self, q: QuantizedTensor) -> torch.Tensor:
        """Unpacked E2M1 codes of a 2-D NVFP4 tensor (uint8, one per element)."""
        return unpack_nibbles(q.data, q.shape[-1])

    def _dequantize_2d(self, q: QuantizedTensor) -> torch.Tensor:
        return e2m1_decode(self.codes(q)) * self._step(q)

    def _ulp_2d(self, q: QuantizedTensor) -> torch.Tensor:
        return e2m1_ulp(self.codes(q)) * self._step(q)

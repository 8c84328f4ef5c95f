"""The ``quantization_config`` block of config.json: write it, and read a format back.

Engines decide how to load a checkpoint from this block alone, so its keys follow
what they read (README, "Checkpoint layouts"): ``quant_method`` "fp8" (DeepSeek-V3 /
Qwen3-FP8), "mxfp8", and "modelopt" with ``quant_algo`` "NVFP4". quantroll adds a
``quantroll`` sub-dict (version, format, scale rule, the plan rules) so that the
weight sync re-quantizes with the rules the checkpoint was made with and inspect
can explain every kept module. Loaders ignore keys they do not know (transformers'
FineGrainedFP8Config takes **kwargs; vLLM reads only its keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from quantroll import __version__
from quantroll.checkpoint.plan import Plan, PlanRules
from quantroll.errors import QuantrollError
from quantroll.formats import Format, get_format

NVFP4_NOTE = (
    "weights use the ModelOpt NVFP4 layout with weight_scale_2 shared within fused q/k/v and gate/up; "
    "input_scale is a placeholder 1.0: quantroll quantizes activations dynamically (global amax/2688 per call) "
    "and ignores it, while engines that apply it as a static calibrated scale (vLLM/SGLang ModelOpt path) will "
    "quantize activations differently, so only quantroll reproduces quantroll's NVFP4 numerics"
)


@dataclass(frozen=True)
class QuantSpec:
    """What a quantized checkpoint says about itself.

    format: the Format instance (MXFP8 carries its scale rule)
    rules:  the PlanRules it was converted with (defaults when not made by quantroll)
    producer: "quantroll <version>" or "unknown"
    """

    format: Format
    rules: PlanRules
    producer: str


def build_quantization_config(fmt: Format, plan: Plan, rules: PlanRules) -> dict:
    """The quantization_config dict for config.json."""
    provenance = {
        "version": __version__,
        "format": fmt.name,
        "scale_rule": getattr(fmt, "scale_rule", None),
        "skip": list(rules.skip),
        "num_layers_at_start_in_bf16": rules.num_layers_at_start_in_bf16,
        "num_layers_at_end_in_bf16": rules.num_layers_at_end_in_bf16,
        "allow_partial_blocks": rules.allow_partial_blocks,
    }
    skipped = plan.modules_to_not_convert()
    if fmt.name == "fp8":
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": skipped,
            "quantroll": provenance,
        }
    if fmt.name == "mxfp8":
        return {
            "quant_method": "mxfp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [1, 32],
            "scale_fmt": "ue8m0",
            "scale_rule": fmt.scale_rule,
            "modules_to_not_convert": skipped,
            "quantroll": provenance,
        }
    if fmt.name == "nvfp4":
        provenance["activation_scheme"] = "dynamic"
        provenance["input_scale"] = 1.0
        provenance["note"] = NVFP4_NOTE
        return {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": 16,
            "kv_cache_quant_algo": None,
            "exclude_modules": skipped,
            "producer": {"name": "quantroll", "version": __version__},
            "quantroll": provenance,
        }
    raise QuantrollError(f"no quantization_config for format '{fmt.name}'")


def build_hf_quant_config(qc: dict) -> dict:
    """ModelOpt's separate hf_quant_config.json (NVFP4 only), which older vLLM reads."""
    return {
        "producer": qc["producer"],
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": 16,
            "exclude_modules": qc["exclude_modules"],
        },
    }


def read_quantization_config(qc: dict, where: str = "config.json") -> QuantSpec:
    """The format (with MXFP8's scale rule) and rules recorded in a quantization_config."""
    from quantroll.jsonfields import JsonFields

    method = qc.get("quant_method")
    ours = qc.get("quantroll") or {}
    if not isinstance(ours, dict):
        raise QuantrollError(f"{where}: quantization_config.quantroll must be an object, got {ours!r}")
    if method == "fp8":
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
        fmt = get_format("fp8")
    elif method == "mxfp8":
        # A checkpoint made elsewhere does not record its rule; Miles/TE/SGLang round up.
        fmt = get_format("mxfp8", qc.get("scale_rule") or ours.get("scale_rule") or "ceil")
    elif method == "modelopt":
        algo = qc.get("quant_algo")
        if algo != "NVFP4" or qc.get("group_size", 16) != 16:
            raise QuantrollError(f"{where}: modelopt quant_algo {algo!r}; quantroll reads NVFP4 with group_size 16 only")
        fmt = get_format("nvfp4")
    else:
        raise QuantrollError(f"{where}: quant_method {method!r} is not one quantroll reads (fp8, mxfp8, modelopt NVFP4)")
    f = JsonFields(ours, where, "quantization_config.quantroll.")
    skip = ours.get("skip") or ()
    if not isinstance(skip, (list, tuple)) or not all(isinstance(name, str) for name in skip):
        raise QuantrollError(f"{where}: quantization_config.quantroll.skip must be a list of names, got {skip!r}")
    rules = PlanRules(
        skip=tuple(skip),
        num_layers_at_start_in_bf16=f.int("num_layers_at_start_in_bf16", 0, minimum=0),
        num_layers_at_end_in_bf16=f.int("num_layers_at_end_in_bf16", 0, minimum=0),
        allow_partial_blocks=f.bool("allow_partial_blocks", False),
    )
    producer = f"quantroll {ours['version']}" if "version" in ours else "unknown"
    return QuantSpec(fmt, rules, producer)

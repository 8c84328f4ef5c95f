"""The ``quantization_config`` block of config.json: write it, and read a format back.

Engines decide how to load a checkpoint from this block alone, so its keys follow
what they read (docs/checkpoints.md, "Checkpoint layouts"): ``quant_method`` "fp8" (DeepSeek-V3 /
Qwen3-FP8), "mxfp8", and "modelopt" with ``quant_algo`` "NVFP4". quantroll adds a
``quantroll`` sub-dict (version, format, scale rule, the plan rules) so that the
weight sync re-quantizes with the rules the checkpoint was made with and inspect
can explain every kept module. Loaders ignore keys they do not know (transformers'
FineGrainedFP8Config takes **kwargs; vLLM reads only its keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from quantroll.version import __version__
from quantroll.checkpoint.plan import Plan, PlanRules
from quantroll.errors import QuantrollError
from quantroll.formats import Format, format_from_quantization_config


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
    return fmt.quantization_config(plan.modules_to_not_convert(), provenance)


def read_quantization_config(qc: dict, where: str = "config.json") -> QuantSpec:
    """The format (with MXFP8's scale rule) and rules recorded in a quantization_config."""
    from quantroll.jsonfields import JsonFields

    ours = qc.get("quantroll") or {}
    if not isinstance(ours, dict):
        raise QuantrollError(f"{where}: quantization_config.quantroll must be an object, got {ours!r}")
    fmt = format_from_quantization_config(qc, ours, where)
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

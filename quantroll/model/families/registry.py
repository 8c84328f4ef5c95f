"""Which family a config.json describes: ``model_type`` first, ``architectures`` when a
config has no model_type. The one list of families quantroll runs: adding a family is a
module beside this one and a line in ``FAMILIES``."""

from __future__ import annotations

from quantroll.errors import QuantrollError
from quantroll.model.families.base import Family, Rope
from quantroll.model.families.llama import LLAMA
from quantroll.model.families.qwen2 import QWEN2
from quantroll.model.families.qwen3 import QWEN3, QWEN3_MOE

FAMILIES: tuple[Family, ...] = (QWEN3, QWEN3_MOE, LLAMA, QWEN2)


def supported_model_types() -> tuple[str, ...]:
    return tuple(t for f in FAMILIES for t in f.model_types)


def family_for(model_type: object, architectures: object = None, source: str = "config.json") -> Family:
    """The family of a config's ``model_type`` (or, without one, of its ``architectures``)."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    if model_type is None and isinstance(architectures, list):
        for family in FAMILIES:
            if any(a in family.architectures for a in architectures):
                return family
    if model_type is not None:
        named = f"model_type '{model_type}'"
    elif architectures is not None:
        named = f"architectures {architectures!r}"
    else:
        raise QuantrollError(f"{source}: no model_type (nor architectures); an HF config.json names its model_type, "
                             f"one of: {', '.join(supported_model_types())}")
    raise QuantrollError(f"{source}: {named} is not supported; supported model_type values: "
                         f"{', '.join(supported_model_types())}")


def rope_variants() -> dict[str, Rope]:
    """Rope types the families brought (any config may name them, as transformers allows)."""
    return {r.name: r for f in FAMILIES for r in f.rope_variants}


def shapes() -> dict[str, dict]:
    """Every family's real model sizes: name -> config.json (model_type included)."""
    return {name: {"model_type": f.model_types[0], **raw} for f in FAMILIES for name, raw in f.shapes}

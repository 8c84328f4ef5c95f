"""Reading a ``quantroll train`` configuration from JSON (what ``TrainConfig.to_json``
writes and `quantroll compare` hands each run): strict, so a config file cannot hold what
the command line could not."""

from __future__ import annotations

import dataclasses
import json

from quantroll.errors import QuantrollError

KINDS = {"str": ((str,), "a string"), "int": ((int,), "an integer"), "float": ((int, float), "a number"),
         "bool": ((bool,), "true or false")}


def typed_value(value, annotation: str, where: str):
    """``value`` checked against a field's annotation (a scalar, ``X | None`` or
    ``tuple[str, ...]``, the only kinds the stages use)."""
    base, optional = annotation.removesuffix(" | None"), annotation.endswith(" | None")
    if value is None:
        if optional:
            return None
        raise QuantrollError(f"{where} is null; it needs {KINDS[base][1]}")
    if base == "tuple[str, ...]":
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise QuantrollError(f"{where} must be a list of strings, got {value!r}")
    kinds, what = KINDS[base]
    if isinstance(value, bool) != (base == "bool") or not isinstance(value, kinds):
        raise QuantrollError(f"{where} must be {what}, got {value!r}")
    return float(value) if base == "float" else value


def stages_from_json(text: str, source: str, stage_types: dict[str, type]) -> dict:
    """stage name -> the stage's value (built, so its own checks ran); an unknown stage or
    key, or a value of the wrong type, is one line naming ``source`` and the key."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise QuantrollError(f"{source}: not JSON ({err}); write it with `quantroll compare` or fix it") from None
    if not isinstance(raw, dict):
        raise QuantrollError(f"{source}: holds {type(raw).__name__}, not an object of stages")
    unknown = sorted(set(raw) - set(stage_types))
    if unknown:
        raise QuantrollError(f"{source}: unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(stage_types)}")
    stages = {}
    for stage, values in raw.items():
        kind = stage_types[stage]
        if not isinstance(values, dict):
            raise QuantrollError(f"{source}: '{stage}' must be an object, got {values!r}")
        fields = {f.name: f for f in dataclasses.fields(kind)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise QuantrollError(f"{source}: unknown key(s) {', '.join(f'{stage}.{k}' for k in unknown)}")
        stages[stage] = kind(**{k: typed_value(v, fields[k].type, f"{source}: '{stage}.{k}'") for k, v in values.items()})
    return stages

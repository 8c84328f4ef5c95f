"""Formats by name: the one place a format is registered, and the look-ups by its facts.

Everything that needs "which format is this" asks here (by registry name, by a
checkpoint's quant_method, by a train recipe flag) instead of testing names, so a new
format is one module in formats/ plus one ``register_format`` call. GPU kernels register
for a format in quantroll.kernels; this module never imports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from quantroll.errors import QuantrollError
from quantroll.formats.base import Format

_FORMATS: dict[str, type[Format]] = {}


def register_format(cls: type[Format]) -> type[Format]:
    """Make ``cls`` known under ``cls.name`` (refused if the name or quant_method is taken)."""
    if cls.name in _FORMATS:
        raise QuantrollError(f"a format named '{cls.name}' is already registered")
    if cls.quant_method and any(c.quant_method == cls.quant_method for c in _FORMATS.values()):
        raise QuantrollError(f"quant_method '{cls.quant_method}' already names a registered format")
    return _FORMATS.setdefault(cls.name, cls)


@contextmanager
def registered(cls: type[Format]) -> Iterator[type[Format]]:
    """``cls`` registered for the duration of a with-block (tests, plug-ins tried out)."""
    register_format(cls)
    try:
        yield cls
    finally:
        _FORMATS.pop(cls.name, None)


def format_names() -> tuple[str, ...]:
    """Registered format names, in registration order."""
    return tuple(_FORMATS)


def format_class(name: str) -> type[Format]:
    if name not in _FORMATS:
        raise QuantrollError(f"unknown format '{name}'; choose one of {', '.join(_FORMATS)}")
    return _FORMATS[name]


def get_format(name: str, scale_rule: str | None = None) -> Format:
    """The format called ``name``; ``scale_rule`` applies to formats with scale rules (MXFP8)."""
    cls = format_class(name)
    if not cls.scale_rules:
        if scale_rule is not None:
            takers = ", ".join(n for n, c in _FORMATS.items() if c.scale_rules)
            raise QuantrollError(f"--scale-rule applies to {takers} only, not to '{name}'")
        return cls()
    return cls(scale_rule or cls.scale_rules[0])


def display_name(name: str) -> str:
    """What reports call the format registered as ``name`` (the name itself if unknown)."""
    cls = _FORMATS.get(name)
    return cls.display_name or cls.name if cls is not None else name


def format_from_quantization_config(qc: dict, ours: dict, where: str) -> Format:
    """The format a checkpoint's quantization_config describes, by its quant_method."""
    method = qc.get("quant_method")
    for cls in _FORMATS.values():
        if cls.quant_method == method:
            return cls.from_quantization_config(qc, ours, where)
    known = ", ".join(cls.reads_as or cls.quant_method for cls in _FORMATS.values())
    raise QuantrollError(f"{where}: quant_method {method!r} is not one quantroll reads ({known})")


def recipe_args(name: str) -> tuple[str, ...]:
    """The train flags that quantize the trainer's forward in format ``name`` (unified modes)."""
    flag = format_class(name).recipe_flag
    if flag is None:
        raise QuantrollError(f"format '{name}' has no train recipe: it cannot run unified")
    return flag


def format_for_recipe(flag: str, value: str | None) -> str | None:
    """The format name a train recipe flag's value selects (None for no value)."""
    if value is None:
        return None
    for cls in _FORMATS.values():
        if cls.recipe_flag == (flag, value):
            return cls.name
    raise QuantrollError(f"{flag} {value!r} names no registered format")


def unified_modes() -> dict[str, str]:
    """{mode number: format name} of the registered formats that have a unified mode."""
    return {cls.unified_mode: cls.name for cls in _FORMATS.values() if cls.unified_mode and cls.recipe_flag}


def recipe_values(flag: str) -> list[str]:
    """The values a train recipe flag takes (its argparse choices)."""
    return [cls.recipe_flag[1] for cls in _FORMATS.values() if cls.recipe_flag and cls.recipe_flag[0] == flag]

"""Model shapes for ``quantroll sft --shape NAME[,field=value...]``.

``tiny`` is the shipped built-in shape (2,048 positions); ``long`` is the study's
(issue 42): eight of the tiny layers (7.4M parameters, a 14.8 MB BF16 checkpoint, under
the 8M / 16 MB budget) and 20,480 positions, room for a 16K-token trace (at most 19,641
tokens with the +-20% spread) after its prompt. Rotary positions are computed from the
position, so a context is a number in config.json, not a table to grow.
"""

from __future__ import annotations

import dataclasses

from quantroll.builtin import TINY_QWEN3_MOE, TinyQwen3
from quantroll.errors import QuantrollError

SHAPES = {
    "tiny": TinyQwen3(),
    "tiny-moe": TINY_QWEN3_MOE,
    "long": TinyQwen3(num_hidden_layers=8, max_position_embeddings=20480),
}


def parse_shape(spec: str, context: int | None = None) -> TinyQwen3:
    """``NAME[,field=value...]`` (fields of TinyQwen3) and, when given, ``context`` as
    max_position_embeddings; one line naming what is wrong otherwise."""
    name, *overrides = [part.strip() for part in spec.split(",")]
    if name not in SHAPES:
        raise QuantrollError(f"--shape {spec!r}: unknown shape {name!r}; choose one of {', '.join(SHAPES)} "
                             "(then ',field=value' to change a field)")
    fields = {f.name: f for f in dataclasses.fields(TinyQwen3)}
    values = {}
    for item in overrides:
        key, eq, raw = item.partition("=")
        if not eq or key not in fields:
            raise QuantrollError(f"--shape {spec!r}: {item!r} is not field=value with a field of "
                                 f"{', '.join(fields)}")
        kind = type(getattr(SHAPES[name], key))
        try:
            values[key] = {"bool": lambda v: {"true": True, "false": False}[v.lower()]}.get(kind.__name__, kind)(raw)
        except (ValueError, KeyError):
            raise QuantrollError(f"--shape {spec!r}: {key} must be a {kind.__name__}, got {raw!r}") from None
    if context is not None:
        if context < 1:  # named as given: the shape's own check would blame --shape
            raise QuantrollError(f"--context must be >= 1 (the positions the model takes), got {context}")
        values["max_position_embeddings"] = context
    shape = dataclasses.replace(SHAPES[name], **values)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings"):
        if getattr(shape, key) < 1:
            raise QuantrollError(f"--shape {spec!r}: {key} must be >= 1, got {getattr(shape, key)}")
    if shape.num_attention_heads % shape.num_key_value_heads:
        raise QuantrollError(f"--shape {spec!r}: num_attention_heads ({shape.num_attention_heads}) must be a multiple "
                             f"of num_key_value_heads ({shape.num_key_value_heads})")
    return shape


def parameter_count(shape: TinyQwen3) -> int:
    """Parameters of a checkpoint of ``shape`` (norms included), counted from its tensors' shapes."""
    h, hd, heads, kv = shape.hidden_size, shape.head_dim, shape.num_attention_heads, shape.num_key_value_heads
    attention = h * hd * (2 * heads + 2 * kv) + 2 * hd
    if shape.moe:
        mlp = shape.num_experts * 3 * h * shape.moe_intermediate_size + shape.num_experts * h
    else:
        mlp = 3 * h * shape.intermediate_size
    layer = attention + mlp + 2 * h
    heads_out = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    return shape.num_hidden_layers * layer + heads_out + h

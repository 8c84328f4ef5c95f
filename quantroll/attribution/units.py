"""Decoder layers and module kinds: the units the gap is attributed to.

A *cell* is one module kind of one layer, ``(layer, kind)``: the linears a BF16 exception
keeps together anyway, because vLLM and SGLang fuse them (q/k/v, gate/up, all experts of a
layer; checkpoint/plan.py keeps fused siblings together). The router (``mlp.gate``) is a
kind of its own: convert always keeps it in BF16, so its share of the gap is the one its
*choices* carry (experts flipped by low-precision inputs), which routing replay removes
and no BF16 exception can.
"""

from __future__ import annotations

import re
from collections import defaultdict

from quantroll.checkpoint.plan import layer_index

KINDS = ("qkv", "o", "gate_up", "down", "experts", "router")
KIND_NAMES = {"qkv": "q/k/v", "o": "o", "gate_up": "gate/up", "down": "down", "experts": "experts",
              "router": "router"}
ROUTER = "router"

_EXPERT = re.compile(r"\.mlp\.experts\.\d+\.")

Cell = tuple[int, str]


def kind_of(module: str) -> str | None:
    """The kind of a quantizable linear, named as in the checkpoint (None: not a decoder linear)."""
    last = module.rpartition(".")[2]
    if _EXPERT.search(module):
        return "experts"
    if ".self_attn." in module:
        return {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o"}.get(last)
    if ".mlp." in module:
        return {"gate_proj": "gate_up", "up_proj": "gate_up", "down_proj": "down"}.get(last)
    return None


def cell_of(module: str) -> Cell | None:
    layer, kind = layer_index(module), kind_of(module)
    return None if layer is None or kind is None else (layer, kind)


def cells_of(modules) -> dict[Cell, tuple[str, ...]]:
    """Cell -> the (sorted) modules in it, for the quantized linears of a checkpoint."""
    out: dict[Cell, list[str]] = defaultdict(list)
    for m in modules:
        c = cell_of(m)
        if c is not None:
            out[c].append(m)
    return {c: tuple(sorted(out[c])) for c in sorted(out, key=cell_order)}


def cell_order(cell: Cell) -> tuple[int, int]:
    return cell[0], KINDS.index(cell[1])


def cell_name(cell: Cell) -> str:
    return f"layer {cell[0]} {KIND_NAMES[cell[1]]}"


def layers_of(cells) -> list[int]:
    return sorted({c[0] for c in cells})


def kinds_of(cells) -> list[str]:
    return [k for k in KINDS if any(c[1] == k for c in cells)]

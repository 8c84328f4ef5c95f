"""BF16 exceptions as the flags a user pastes, and back.

The flags are the ones ``convert``, ``train`` and ``compare`` share (Miles' names for the
layer counts): ``--num-layers-at-start-in-bf16 N``, ``--num-layers-at-end-in-bf16 N`` and
``--skip PATTERN ...`` for what those cannot express. ``render`` turns kept cells into the
shortest such set this module knows (whole leading / trailing layers as counts, other whole
layers as ``model.layers.i.*``, a kind kept in every layer as one pattern, the rest cell by
cell); ``parse`` reads a flag set back; ``kept_modules`` applies it with convert's own
planner, so a proposal is checked against what ``convert`` will really keep.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

from quantroll.attribution.units import Cell
from quantroll.checkpoint.plan import KEEP, PlanRules, plan
from quantroll.errors import QuantrollError
from quantroll.formats import get_format

# shell-style patterns per kind, matched by convert against module names and their dot-suffixes
_KIND_PATTERNS = {
    "qkv": ("self_attn.[qkv]_proj",),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
    "experts": ("mlp.experts.*",),
}


@dataclass(frozen=True)
class FlagSet:
    """BF16 exceptions as convert's rules (the fields of ConvertConfig / PlanRules)."""

    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0
    skip: tuple[str, ...] = ()

    def args(self) -> list[str]:
        out = []
        if self.num_layers_at_start_in_bf16:
            out += ["--num-layers-at-start-in-bf16", str(self.num_layers_at_start_in_bf16)]
        if self.num_layers_at_end_in_bf16:
            out += ["--num-layers-at-end-in-bf16", str(self.num_layers_at_end_in_bf16)]
        if self.skip:
            out += ["--skip", *self.skip]
        return out

    def text(self) -> str:
        """What a user pastes (patterns quoted for the shell)."""
        return " ".join(shlex.quote(a) for a in self.args())

    def convert_fields(self) -> dict:
        return {"skip": tuple(self.skip), "num_layers_at_start_in_bf16": self.num_layers_at_start_in_bf16,
                "num_layers_at_end_in_bf16": self.num_layers_at_end_in_bf16}

    @property
    def empty(self) -> bool:
        return not self.args()


def render(kept: set[Cell], all_cells: set[Cell], num_layers: int) -> FlagSet:
    """The flags that keep exactly the cells ``kept`` of the quantizable cells ``all_cells``.

    A layer counts as whole when every quantizable cell of it is kept. Leading whole layers
    become ``--num-layers-at-start-in-bf16``, trailing ones ``--num-layers-at-end-in-bf16``
    (never all layers: convert refuses that; the rest become patterns)."""
    kept = set(kept) & set(all_cells)
    per_layer = {i: {c for c in all_cells if c[0] == i} for i in range(num_layers)}
    whole = {i for i, cells in per_layer.items() if cells and cells <= kept}
    start = 0
    while start in whole:
        start += 1
    end = 0
    while end < num_layers - start and (num_layers - 1 - end) in whole:
        end += 1
    if start + end >= num_layers:  # everything kept: convert's counts would refuse, say it cell by cell
        start = end = 0
    by_count = set(range(start)) | set(range(num_layers - end, num_layers))
    skip: list[str] = [f"model.layers.{i}.*" for i in sorted(whole - by_count)]
    rest = {c for c in kept if c[0] not in whole}
    for kind, patterns in _KIND_PATTERNS.items():
        layers_with = {c[0] for c in all_cells if c[1] == kind}
        kept_in = {c[0] for c in rest if c[1] == kind}
        if len(layers_with) > 1 and kept_in and kept_in | (layers_with & whole) == layers_with:
            skip += [f"*.{p}" for p in patterns]  # this kind in every layer
            rest -= {c for c in rest if c[1] == kind}
    for layer in sorted({c[0] for c in rest}):
        skip += _layer_patterns(layer, {c[1] for c in rest if c[0] == layer})
    return FlagSet(start, end, tuple(skip))


class _Refuse(argparse.ArgumentParser):
    def error(self, message):
        raise argparse.ArgumentError(None, message)


def _layer_patterns(layer: int, kinds: set[str]) -> list[str]:
    """Patterns for some kinds of one layer: a whole attention or a whole dense MLP as one
    pattern (``self_attn.*`` also matches q/k norms, which convert keeps anyway), q/k/v as
    one character class."""
    p = f"model.layers.{layer}."
    out = []
    if {"qkv", "o"} <= kinds:
        out.append(p + "self_attn.*")
    elif "qkv" in kinds:
        out.append(p + "self_attn.[qkv]_proj")
    elif "o" in kinds:
        out.append(p + "self_attn.o_proj")
    if {"gate_up", "down"} <= kinds:
        out.append(p + "mlp.*")
    else:
        out += [p + q for k in ("gate_up", "down") if k in kinds for q in _KIND_PATTERNS[k]]
    if "experts" in kinds:
        out.append(p + "mlp.experts.*")
    return out


def _parser() -> argparse.ArgumentParser:
    p = _Refuse(add_help=False, exit_on_error=False, allow_abbrev=False)
    p.add_argument("--num-layers-at-start-in-bf16", type=int, default=0)
    p.add_argument("--num-layers-at-end-in-bf16", type=int, default=0)
    p.add_argument("--skip", nargs="+", action="extend", default=[])
    return p


def parse(text: str, flag: str = "--bf16-exceptions") -> FlagSet:
    """A pasted flag set back into a FlagSet; anything else is one line naming ``flag``."""
    try:
        words = shlex.split(text)
        ns, extra = _parser().parse_known_args(words)
    except (ValueError, argparse.ArgumentError) as err:
        raise QuantrollError(f"{flag} {text!r}: {err}; give flags as `quantroll attribute` prints them") from None
    if extra:
        raise QuantrollError(f"{flag} {text!r}: {' '.join(extra)} is not one of --num-layers-at-start-in-bf16, "
                             "--num-layers-at-end-in-bf16, --skip")
    if ns.num_layers_at_start_in_bf16 < 0 or ns.num_layers_at_end_in_bf16 < 0:
        raise QuantrollError(f"{flag} {text!r}: layer counts must be >= 0")
    return FlagSet(ns.num_layers_at_start_in_bf16, ns.num_layers_at_end_in_bf16, tuple(ns.skip))


def kept_modules(flags: FlagSet, shapes: dict, fmt_name: str, num_layers: int) -> set[str]:
    """The modules convert keeps in BF16 under ``flags`` (every reason: embeddings, norms too)."""
    rules = PlanRules(tuple(flags.skip), flags.num_layers_at_start_in_bf16, flags.num_layers_at_end_in_bf16)
    decided = plan(shapes, get_format(fmt_name), rules, num_layers)
    return {d.module for d in decided.decisions.values() if d.action == KEEP}

"""Exact ablations: the gap with only a unit in low precision, and with all but that unit.

For a unit u (a layer, a module kind across layers, or one cell) with linears M_u, and A
every linear the conversion quantizes, per seed:

  only(u)    = gap(M_u low precision, the rest BF16)
  without(u) = gap(A - M_u low precision): what the rollout's gap would be with u in BF16
  saved(u)   = gap(A) - without(u): what keeping u in BF16 buys (the ranking's key)

only and saved differ where errors interact (a layer's error grows or cancels through the
layers after it); both are exact measurements, neither an estimate. The router is never
quantized, so its unit is defined by its choices: only(router) replays the full
conversion's expert choices into the BF16 model, saved(router) is gap(A) minus the gap of
A with the BF16 model's choices replayed (what routing replay, r3, removes).
"""

from __future__ import annotations

from dataclasses import dataclass

from quantroll.attribution.measure import Measurer
from quantroll.attribution.units import KIND_NAMES, ROUTER, Cell, cell_name, kinds_of, layers_of
from quantroll.compare.stats import stats


@dataclass(frozen=True)
class Contribution:
    unit: str  # "layer 2", "down", "layer 2 down"
    level: str  # "layer" | "kind" | "cell"
    key: object  # the layer index, the kind, or the (layer, kind) cell
    only: dict  # stats over seeds of only(u)
    without: dict  # stats of without(u)
    saved: dict  # stats of saved(u)

    def to_json(self) -> dict:
        key = list(self.key) if isinstance(self.key, tuple) else self.key
        return {"unit": self.unit, "level": self.level, "key": key, "only": self.only, "without": self.without,
                "saved": self.saved}


def _contribution(m: Measurer, unit: str, level: str, key, modules: frozenset) -> Contribution:
    full = m.gap(m.all_modules)
    only = m.gap(modules)
    without = m.gap(m.all_modules - modules)
    return Contribution(unit, level, key, stats(only), stats(without), stats([f - w for f, w in zip(full, without)]))


def _router(m: Measurer) -> Contribution:
    full = m.gap(m.all_modules)
    replayed = m.gap(m.all_modules, routing="bf16")
    return Contribution(KIND_NAMES[ROUTER], "kind", ROUTER, stats(m.gap(frozenset(), routing="full")),
                        stats(replayed), stats([f - r for f, r in zip(full, replayed)]))


def units(cells: dict[Cell, tuple[str, ...]], moe: bool) -> list[tuple[str, str, object, frozenset]]:
    """(name, level, key, modules) of every unit: layers, kinds, cells (router apart)."""
    out = []
    for layer in layers_of(cells):
        out.append((f"layer {layer}", "layer", layer, frozenset(m for c, ms in cells.items() if c[0] == layer for m in ms)))
    for kind in kinds_of(cells):
        out.append((KIND_NAMES[kind], "kind", kind, frozenset(m for c, ms in cells.items() if c[1] == kind for m in ms)))
    for cell, ms in cells.items():
        out.append((cell_name(cell), "cell", cell, frozenset(ms)))
    return out


def ablate(m: Measurer, cells: dict[Cell, tuple[str, ...]], progress=None) -> list[Contribution]:
    """Every unit's contribution; ``progress(n)`` is called after each unit."""
    out = []
    for name, level, key, modules in units(cells, m.moe):
        out.append(_contribution(m, name, level, key, modules))
        if progress:
            progress(1)
    if m.moe:
        out.append(_router(m))
        if progress:
            progress(1)
    return out


def ranking(contributions: list[Contribution], level: str) -> list[Contribution]:
    """The units of one level, largest saved gap first (ties: larger only-gap first)."""
    rows = [c for c in contributions if c.level == level]
    return sorted(rows, key=lambda c: (-(c.saved["mean"] or 0.0), -(c.only["mean"] or 0.0)))

"""The smallest set of cells to keep in BF16 that brings the gap under a target.

Greedy forward selection on measured gaps (exact, every candidate evaluated): start with
nothing kept; at each step try keeping each remaining cell as well; if some candidates
reach the target, keep the one with the fewest BF16 weight bytes among them, otherwise the
one that lowers the gap most; stop when the target is reached or nothing is left. Greedy
is not guaranteed minimal (interactions can make a pair better than the best single), but
every step is a measurement, and the result is verified apart (verify.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quantroll.attribution.units import Cell, cell_name, cell_order


@dataclass(frozen=True)
class Step:
    cell: Cell
    gap: float  # mean gap with every cell chosen so far (this one included) kept in BF16

    def to_json(self) -> dict:
        return {"cell": list(self.cell), "name": cell_name(self.cell), "gap": self.gap}


def greedy(cells: list[Cell], gap_keeping: Callable[[frozenset], float], target: float, cost: dict[Cell, int],
           progress=None) -> tuple[list[Step], float]:
    """(steps taken, the gap with nothing kept). ``gap_keeping(kept)`` measures the mean gap
    with the cells ``kept`` in BF16 and every other cell low precision."""
    kept: frozenset = frozenset()
    current = start = gap_keeping(kept)
    steps: list[Step] = []
    remaining = sorted(cells, key=cell_order)
    while current > target and remaining:
        tried = {c: gap_keeping(kept | {c}) for c in remaining}
        if progress:
            progress(len(tried))
        reaching = [c for c in remaining if tried[c] <= target]
        if reaching:
            best = min(reaching, key=lambda c: (cost[c], tried[c], cell_order(c)))
        else:
            best = min(remaining, key=lambda c: (tried[c], cost[c], cell_order(c)))
        kept |= {best}
        current = tried[best]
        remaining.remove(best)
        steps.append(Step(best, current))
    return steps, start


def weight_bytes(layer) -> int:
    """Bytes a quantized linear stores (codes, scales, global scale)."""
    total = 0
    for name in ("weight", "weight_scale", "weight_global"):
        t = getattr(layer, name, None)
        if t is not None:
            total += t.numel() * t.element_size()
    return total


def bf16_bytes(layer) -> int:
    return layer.out_features * layer.in_features * 2

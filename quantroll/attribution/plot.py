"""The report's plot: gap contribution per layer and per module kind (PNG).

Three panels from the result dict alone: per layer and per kind, the exact "only" gap
(that unit alone in low precision) and the "saved" gap (full gap minus the gap with that
unit in BF16), ± one std over seeds; and a layer x kind map of each cell's saved gap.
matplotlib is imported here only (Figure, no pyplot: no global state).
"""

from __future__ import annotations

from pathlib import Path

from quantroll.attribution.units import KIND_NAMES, KINDS


def _bars(ax, rows: list[dict], title: str) -> None:
    x = list(range(len(rows)))
    for shift, key, name in ((-0.2, "only", "only this unit low precision"),
                             (0.2, "saved", "saved by keeping it BF16")):
        y = [r[key]["mean"] or 0.0 for r in rows]
        err = [r[key]["std"] or 0.0 for r in rows]
        ax.bar([i + shift for i in x], y, width=0.4, yerr=err if any(err) else None, capsize=2, label=name)
    ax.set_xticks(x)
    ax.set_xticklabels([r["unit"] for r in rows], fontsize=8, rotation=0)
    ax.axhline(0, color="black", lw=0.5)
    ax.set_ylabel("mean |logp_train - logp_rollout|", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)


def plot_contributions(result: dict, path: Path) -> Path:
    from matplotlib.figure import Figure

    rows = result["contributions"]
    layers = [r for r in rows if r["level"] == "layer"]
    kinds = [r for r in rows if r["level"] == "kind"]
    cells = {(r["key"][0], r["key"][1]): r["saved"]["mean"] or 0.0 for r in rows if r["level"] == "cell"}
    kind_keys = [k for k in KINDS if any(c[1] == k for c in cells)]
    layer_keys = sorted({c[0] for c in cells})
    fig = Figure(figsize=(13, 4.2), dpi=110)
    _bars(fig.add_subplot(1, 3, 1), layers, "per decoder layer")
    _bars(fig.add_subplot(1, 3, 2), kinds, "per module kind (all layers)")
    ax = fig.add_subplot(1, 3, 3)
    grid = [[cells.get((layer, k), float("nan")) for k in kind_keys] for layer in layer_keys]
    peak = max((abs(v) for v in cells.values()), default=1.0) or 1.0
    image = ax.imshow(grid, cmap="RdBu_r", vmin=-peak, vmax=peak, aspect="auto")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(kind_keys)))
    ax.set_xticklabels([KIND_NAMES[k] for k in kind_keys], fontsize=7)
    ax.set_yticks(range(len(layer_keys)))
    ax.set_yticklabels([f"layer {i}" for i in layer_keys], fontsize=7)
    ax.set_title("saved by keeping one cell BF16", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(f"{result['model']}: where the {result['precision_label']} gap comes from "
                 f"(exact ablations, {len(result['gap_full_per_seed'])} seeds)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", bbox_inches="tight")
    return path

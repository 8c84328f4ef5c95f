"""PNG plots of the study, drawn from summary.json alone.

matplotlib is imported inside the functions (the package must stay cheap to import),
and figures are made with ``matplotlib.figure.Figure`` rather than pyplot: no global
backend switch, no figure registry to leak, Agg rendering straight to PNG.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from quantroll.compare.perrun import MAIN_GAP


def _figure(width: float = 7.0, height: float = 4.2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    return fig, fig.add_subplot(1, 1, 1)


def _name(g: dict) -> str:
    return f"{g['label']} / {g['correction']}"


def _maybe_log(ax, values: list[float]) -> None:
    """Log scale when the values are positive and span more than ~2 decades (bf16 vs FP4 gaps)."""
    vals = [v for v in values if v is not None]
    if vals and min(vals) > 0 and max(vals) / min(vals) > 100:
        ax.set_yscale("log")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def curve_plot(summary: dict, key: str, ylabel: str, title: str, path: Path) -> Path | None:
    """Per group: mean over seeds per step, with a band of ± one std where there are seeds to spread."""
    groups = [g for g in summary["groups"] if any(p["mean"] is not None for p in g["curves"].get(key, []))]
    if not groups:
        return None
    fig, ax = _figure()
    seen = []
    for g in groups:
        pts = [p for p in g["curves"][key] if p["mean"] is not None]
        x, y = [p["step"] for p in pts], [p["mean"] for p in pts]
        (line,) = ax.plot(x, y, marker="o", markersize=3, label=_name(g))
        band = [p for p in pts if p["std"] is not None]
        if band:
            ax.fill_between([p["step"] for p in band], [p["mean"] - p["std"] for p in band],
                            [p["mean"] + p["std"] for p in band], color=line.get_color(), alpha=0.2, linewidth=0)
        seen += y
    if key == MAIN_GAP:
        _maybe_log(ax, seen)
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def sweep_plot(summary: dict, path: Path) -> Path | None:
    """Step-0 gap vs response length, one line per (mode, correction), error bars = std over seeds."""
    lines: dict[str, list[dict]] = {}
    for s in summary["sweep"]:
        if s["gap_step0"][MAIN_GAP]["mean"] is not None and s["response_len"] is not None:
            lines.setdefault(_name(s), []).append(s)
    if not lines:
        return None
    fig, ax = _figure()
    seen = []
    for name, rows in lines.items():
        rows = sorted(rows, key=lambda r: r["response_len"])
        st = [r["gap_step0"][MAIN_GAP] for r in rows]
        ax.errorbar([r["response_len"] for r in rows], [s["mean"] for s in st],
                    yerr=[s["std"] or 0.0 for s in st], marker="o", capsize=3, label=name)
        seen += [s["mean"] for s in st]
    ax.set_xscale("log", base=2)
    lengths = sorted({r["response_len"] for rows in lines.values() for r in rows})
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(n) for n in lengths])
    ax.minorticks_off()
    _maybe_log(ax, seen)
    ax.set_xlabel("response length limit (tokens)")
    ax.set_ylabel("|logp_train - logp_rollout| at step 0")
    ax.set_title("Gap vs response length (sweep, step 0)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def time_plot(summary: dict, path: Path) -> Path | None:
    """Stacked seconds per step: rollout, train, weight quantize, weight load."""
    groups = summary["groups"]
    if not groups:
        return None
    parts = (("rollout_time", "rollout"), ("train_time", "train"),
             ("weight_quantize_time", "weight quantize"), ("weight_load_time", "weight load"))
    fig, ax = _figure(max(7.0, 1.1 * len(groups) + 2), 4.6)
    x = list(range(len(groups)))
    bottom = [0.0] * len(groups)
    for key, label in parts:
        h = [g["time"][key]["mean"] or 0.0 for g in groups]
        ax.bar(x, h, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, h)]
    ax.set_xticks(x)
    ax.set_xticklabels([textwrap.fill(_name(g), 16) for g in groups], fontsize=6)
    ax.set_ylabel("seconds per step (warm-up excluded)")
    ax.set_title("Time per step")
    ax.legend(fontsize=7)
    return _save(fig, path)


def write_plots(summary: dict, plot_dir: str | Path) -> dict[str, Path]:
    """Every plot that has data, as {file name: path} under plot_dir."""
    d = Path(plot_dir)
    made = {
        "gap_vs_step.png": curve_plot(summary, MAIN_GAP, "|logp_train - logp_rollout|",
                                      "Train/rollout gap per step (mean ± std over seeds)", d / "gap_vs_step.png"),
        "gap_vs_response_len.png": sweep_plot(summary, d / "gap_vs_response_len.png"),
        "reward_vs_step.png": curve_plot(summary, "reward_mean", "mean reward",
                                         "Reward per step (mean ± std over seeds)", d / "reward_vs_step.png"),
        "time_breakdown.png": time_plot(summary, d / "time_breakdown.png"),
    }
    return {k: v for k, v in made.items() if v is not None}

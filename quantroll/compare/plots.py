"""PNG plots of the study, drawn from summary.json alone.

matplotlib is imported inside the functions (the package must stay cheap to import),
and figures are made with ``matplotlib.figure.Figure`` rather than pyplot: no global
backend switch, no figure registry to leak, Agg rendering straight to PNG.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from quantroll.compare.perrun import MAIN_GAP


def _figure(width: float = 10.0, height: float = 4.5):
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
    fig.savefig(path, format="png", bbox_inches="tight")  # keeps a legend placed outside the axes
    return path


def _shift(i: int, n: int) -> float:
    """A small sideways offset per line, so that error bars at one step do not hide each other."""
    return (i - (n - 1) / 2) * 0.06


def _errorbar(ax, x, points, **kw):
    """Means with error bars of ± one std over seeds (none where a point has one seed)."""
    y = [p["mean"] for p in points]
    err = [p["std"] or 0.0 for p in points]
    return ax.errorbar(x, y, yerr=err if any(err) else None, capsize=2, elinewidth=0.8, markersize=3, **kw)


def _finish(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # beside, not on, the data


def curve_plot(summary: dict, key: str, ylabel: str, title: str, path: Path) -> Path | None:
    """Per group: mean over seeds per step, error bars ± one std where there are seeds to spread."""
    groups = [g for g in summary["groups"] if any(p["mean"] is not None for p in g["curves"].get(key, []))]
    if not groups:
        return None
    fig, ax = _figure()
    seen = []
    for i, g in enumerate(groups):
        pts = [p for p in g["curves"][key] if p["mean"] is not None]
        _errorbar(ax, [p["step"] + _shift(i, len(groups)) for p in pts], pts, marker="o", label=_name(g))
        seen += [p["mean"] for p in pts]
    if key == MAIN_GAP:
        _maybe_log(ax, seen)
    _finish(ax, "RL step", ylabel, title)
    return _save(fig, path)


def eval_plot(summary: dict, path: Path) -> Path | None:
    """Held-out greedy accuracy vs step: the engine's policy (solid) and the trainer's (dashed), per group."""
    keys = (("eval_engine_accuracy", "engine", "-", "o"), ("eval_trainer_accuracy", "trainer", "--", "s"))
    groups = [g for g in summary["groups"] if any(g["curves"].get(k) for k, *_ in keys)]
    if not groups:
        return None
    fig, ax = _figure()
    for i, g in enumerate(groups):
        color = f"C{i % 10}"
        for key, side, style, marker in keys:
            pts = [p for p in g["curves"].get(key, []) if p["mean"] is not None]
            if pts:
                _errorbar(ax, [p["step"] + _shift(i, len(groups)) for p in pts], pts, color=color, linestyle=style,
                          marker=marker, label=f"{_name(g)}, {side}")
    _finish(ax, "RL step (evaluated before the step's rollout)", "held-out greedy accuracy",
            "Held-out accuracy per step (mean ± std over seeds)")
    return _save(fig, path)


def length_plot(summary: dict, path: Path) -> Path | None:
    """Gap vs response length, per group: by response-length bucket over all steps (solid),
    and the sweep runs' step-0 gap at each forced length (dashed); error bars = std over seeds."""
    fig, ax = _figure()
    seen, lengths, colors = [], set(), {}

    def color(name: str) -> str:  # a group and its sweep share a colour
        return colors.setdefault(name, f"C{len(colors) % 10}")

    for g in summary["groups"]:
        pts = [(int(b), v[MAIN_GAP]) for b, v in g.get("gap_by_len", {}).items() if v[MAIN_GAP]["mean"] is not None]
        if pts:
            _errorbar(ax, [b for b, _ in pts], [s for _, s in pts], color=color(_name(g)), marker="o",
                      label=f"{_name(g)} (by length, all steps)")
            seen += [s["mean"] for _, s in pts]
            lengths.update(b for b, _ in pts)
    sweeps: dict[str, list[dict]] = {}
    for s in summary["sweep"]:
        if s["gap_step0"][MAIN_GAP]["mean"] is not None and s["response_len"] is not None:
            sweeps.setdefault(_name(s), []).append(s)
    for name, rows in sweeps.items():
        rows = sorted(rows, key=lambda r: r["response_len"])
        st = [r["gap_step0"][MAIN_GAP] for r in rows]
        _errorbar(ax, [r["response_len"] for r in rows], st, color=color(name), linestyle="--",
                  marker="s", label=f"{name} (sweep, step 0)")
        seen += [x["mean"] for x in st]
        lengths.update(r["response_len"] for r in rows)
    if not seen:
        return None
    ax.set_xscale("log", base=2)
    ticks = sorted(lengths)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(n) for n in ticks])
    ax.minorticks_off()
    _maybe_log(ax, seen)
    _finish(ax, "response length (tokens; bucket b holds b to 2b-1)", "|logp_train - logp_rollout|",
            "Gap vs response length (mean ± std over seeds)")
    return _save(fig, path)


def time_plot(summary: dict, path: Path) -> Path | None:
    """Seconds per step, stacked: rollout, train, weight quantize, weight load; one horizontal
    bar per group (its full name readable on the y axis), error bars ± one std over seeds."""
    groups = summary["groups"]
    if not groups:
        return None
    parts = (("rollout_time", "rollout"), ("train_time", "train"),
             ("weight_quantize_time", "weight quantize"), ("weight_load_time", "weight load"))
    fig, ax = _figure(8.0, max(2.8, 0.55 * len(groups) + 1.6))
    y = list(range(len(groups)))[::-1]
    left = [0.0] * len(groups)
    for key, label in parts:
        w = [g["time"][key]["mean"] or 0.0 for g in groups]
        err = [g["time"][key]["std"] or 0.0 for g in groups]
        ax.barh(y, w, left=left, label=label, xerr=err if any(err) else None,
                error_kw={"elinewidth": 0.8, "capsize": 2})
        left = [a + b for a, b in zip(left, w)]
    ax.set_yticks(y)
    ax.set_yticklabels([textwrap.fill(_name(g), 44) for g in groups], fontsize=7)
    ax.set_xlabel("seconds per step (warm-up excluded); error bars ± std over seeds", fontsize=9)
    ax.set_title("Time per step", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return _save(fig, path)


def write_plots(summary: dict, plot_dir: str | Path) -> dict[str, Path]:
    """Every plot that has data, as {file name: path} under plot_dir."""
    d = Path(plot_dir)
    made = {
        "gap_vs_step.png": curve_plot(summary, MAIN_GAP, "|logp_train - logp_rollout|",
                                      "Train/rollout gap per step (mean ± std over seeds)", d / "gap_vs_step.png"),
        "gap_vs_response_len.png": length_plot(summary, d / "gap_vs_response_len.png"),
        "reward_vs_step.png": curve_plot(summary, "reward_mean", "mean reward",
                                         "Reward per step (mean ± std over seeds)", d / "reward_vs_step.png"),
        "eval_vs_step.png": eval_plot(summary, d / "eval_vs_step.png"),
        "time_breakdown.png": time_plot(summary, d / "time_breakdown.png"),
    }
    return {k: v for k, v in made.items() if v is not None}

"""The gap job's numbers for the long-study report (bench/long_study_report.py): per length
and group, the step-0 and step-1 gap read from each run's metrics, and how the step-0 gap
grows from the shortest length to the longest at three levels.

Why three levels: the token-level gap (mean abs logp diff) measures the kernels' error per
token and need not grow with length; what a correction acts on is the sequence: the k3 KL
summed over a sequence's tokens (the mean over sequences of those sums, which is the token
mean times the mean response length) grows with length at a fixed per-token gap, and
chi2_seq, the variance of the sequence-level importance weight, grows faster. chi2_seq is
an estimate from the batch's sequences (mean of w^2 - 1): it can come out below zero when the
sampled weights average below 1, and is shown signed.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantroll.compare.rundata import read_metrics

GAP_KEYS = ("train_rollout_logprob_abs_diff", "train_rollout_kl", "log_ppl_diff", "chi2_token", "chi2_seq")
GROWTH_LEVELS = ("token abs logp diff", "sequence KL (nats)", "chi2_seq")


def read_json(path: Path):
    """A job's JSON file, or None where the job has not written it."""
    return json.loads(path.read_text()) if path.is_file() else None


def read_jsonl(path: Path) -> list[dict]:
    """A job's JSON-lines file (calls, metrics), or [] where it has not written it."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def run_steps(run_dir: Path) -> list[dict]:
    """A run's metrics by step (compare's own reader): a last line cut by a kill is dropped,
    as a run interrupted mid-write leaves it, rather than failing the whole report."""
    return read_metrics(run_dir / "metrics.jsonl")[0]


def gap_rows(root: Path) -> list[dict]:
    """One row per (length, run): the gap metrics at steps 0 and 1, from the run's metrics."""
    rows = []
    for where in sorted((root / "gap").glob("*/compare"), key=lambda p: int(p.parent.name)):
        summary = read_json(where / "summary.json") or {"runs": []}
        for run in summary["runs"]:
            steps = {r["step"]: r for r in run_steps(where / "runs" / run["run_id"])}
            rows.append({"length": int(where.parent.name), "run_id": run["run_id"], "label": run["label"],
                         "seed": run.get("seed"), "status": run["status"],
                         "response_len_mean": steps.get(0, {}).get("response_len_mean"),
                         "entropy@0": steps.get(0, {}).get("entropy"),
                         **{f"{k}@{s}": steps.get(s, {}).get(k) for k in GAP_KEYS for s in (0, 1)}})
    return rows


def sequence_kl(row: dict) -> float | None:
    """The step-0 k3 KL summed over each sequence's tokens, averaged over sequences: the
    token mean (train_rollout_kl) times the mean response length (tokens / sequences)."""
    kl, length = row.get("train_rollout_kl@0"), row.get("response_len_mean")
    return kl * length if kl is not None and length is not None else None


def _level(row: dict, level: str) -> float | None:
    if level == "token abs logp diff":
        return row.get("train_rollout_logprob_abs_diff@0")
    if level == "sequence KL (nats)":
        return sequence_kl(row)
    return row.get("chi2_seq@0")


def by_length(rows: list[dict], label: str, level: str) -> dict[int, float]:
    """A group's step-0 value at each length it ran, the mean over its seeds there (a seed
    without the value is left out)."""
    out: dict[int, list[float]] = {}
    for r in rows:
        value = _level(r, level) if r["label"] == label else None
        if value is not None:
            out.setdefault(r["length"], []).append(value)
    return {n: sum(v) / len(v) for n, v in sorted(out.items())}


def gap_growth(rows: list[dict]) -> tuple[list[int], list[dict]]:
    """(the lengths, one row per group and level): the step-0 value at each length (the mean
    over seeds where a cell has several) and the growth from the shortest length to the
    longest (None where either is missing or not above zero: a chi2 estimate below zero has
    no ratio)."""
    lengths = sorted({r["length"] for r in rows})
    out = []
    for label in sorted({r["label"] for r in rows}):
        for level in GROWTH_LEVELS:
            means = by_length(rows, label, level)
            values = {n: means.get(n) for n in lengths}
            lo, hi = values[lengths[0]], values[lengths[-1]]
            growth = hi / lo if len(lengths) > 1 and lo is not None and hi is not None and lo > 0 and hi > 0 else None
            out.append({"label": label, "level": level, "values": values, "growth": growth})
    return lengths, out


def gap_axes(ax, rows: list[dict], level: str) -> None:
    """One level of the step-0 gap against length on ``ax``, one line per group through its
    seeds' mean at each length (log axes: the token gap and the sequence KL are never negative)."""
    for label in sorted({r["label"] for r in rows}):
        pts = [(n, v) for n, v in by_length(rows, label, level).items() if v > 0]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("--trace-len (tokens)")
    ax.set_title(f"step 0: {level}")


def gap_plot(rows: list[dict], path: Path) -> bool:
    """Step-0 token-level gap and sequence KL against length, one line per group."""
    from matplotlib.figure import Figure

    if not rows:
        return False
    fig = Figure(figsize=(10, 4))
    for i, level in enumerate(GROWTH_LEVELS[:2]):
        gap_axes(fig.add_subplot(1, 2, i + 1), rows, level)
    fig.axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True

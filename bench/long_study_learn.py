"""The learning jobs' curves for the long-study report (bench/long_study_report.py) and the
README's figure: reward per step of every run, grouped as compare groups them.

Read from each run's own record (run.json: precision, unified, KV dtype, correction, seed)
and metrics.jsonl, so a job whose compare has not finished is drawn too: only runs marked
done are drawn, with the others counted in the panel's title, because a run cut mid-way
restarts from step 0 on a bare machine and its partial curve is not the run that will count.
"""

from __future__ import annotations

from pathlib import Path

from long_study_gap import GROWTH_LEVELS, gap_axes, read_json, run_steps
from quantroll.compare.labels import group_id, mode_label, sort_key
from quantroll.compare.recommend import recommend


def judged(summary: dict) -> dict:
    """A compare summary with its answer made again by the current rule (recommend.py) from the
    same saved groups: a rule mended after the GPU runs reaches the report with no rerun."""
    base = next((g for g in summary["groups"] if g["id"] == summary.get("baseline")), None)
    return {**summary, "recommendation": recommend(summary["groups"], base)}


def learn(root: Path, job: str) -> dict | None:
    """A learning job's answer from its compare's summary.json: the recommendation's lines and per
    group the reward and held-out numbers; None where there is none. Only the job's last call says
    whether that summary covers the whole matrix (long_study_jobs.extract asks it). The answer is
    compare's as written; the report answers it again by the current rule (long_study_report.rejudge)."""
    summary = read_json(root / job / "compare" / "summary.json")
    return None if summary is None else learn_result(summary)


def learn_result(summary: dict) -> dict:
    """What the report keeps of a learning job's compare summary (see learn)."""
    groups = [{"label": g["label"], "correction": g["correction"], "seeds": g["seeds"],
               "reward_step0": g["reward"].get("step0"), "reward_last_k": g["reward"].get("last_steps"),
               "last_k": g["reward"].get("last_k"), "eval_trainer_first": g["eval"].get("first_trainer"),
               "eval_trainer_last": g["eval"].get("trainer"), "gap_mean": g["gap_mean"].get(summary["main_gap"])}
              for g in summary["groups"]]
    return {"answer": [m["text"] for m in summary["recommendation"]["modes"]], "groups": groups,
            "heldout_baseline": summary.get("heldout_baseline"), "failed": summary.get("failed", [])}


def learn_curves(root: Path, job: str) -> list[dict]:
    """One entry per run of ``job``: its id, group (compare's label / correction), seed, status,
    reward per step, and the trainer's policy's held-out greedy accuracy (what compare's acceptance
    judges) and reward per evaluation (in mode 1 through a BF16 engine copy); in compare's group
    order (BF16 first), then by seed."""
    out = []
    for run_dir in sorted((root / job / "compare" / "runs").glob("*")):
        record = read_json(run_dir / "run.json")
        if record is None:
            continue
        steps = run_steps(run_dir)
        spec = (record["precision"], record["unified"], record.get("kv_cache_dtype", "bf16"),
                record.get("bf16_exceptions", False))
        out.append({"run_id": run_dir.name, "group": group_id(mode_label(*spec), record["correction"]),
                    "seed": record["seed"], "status": record["status"],
                    "order": sort_key(spec[0], spec[1], record["correction"], *spec[2:]),
                    "reward": [r.get("reward_mean") for r in steps],
                    **{f"heldout_{what}": [r[key] for r in steps if r.get(key) is not None]
                       for what, key in (("accuracy", "eval_trainer_accuracy"), ("reward", "eval_trainer_reward"))}})
    return sorted(out, key=lambda c: (c["order"], c["seed"]))


def learn_progress(curves: list[dict]) -> list[dict]:
    """Per run of a learning job whose compare has not finished: its status, how many steps it
    wrote, its reward at the first and last of them, its first and last held-out accuracy and reward."""
    def ends(values: list) -> tuple:
        return (values[0], values[-1]) if values else (None, None)

    return [{"run_id": c["run_id"], "status": c["status"], "steps": len(c["reward"]),
             **dict(zip(("reward_first", "reward_last"), ends(c["reward"]))),
             **{f"heldout_{what}_{end}": value for what in ("accuracy", "reward")
                for end, value in zip(("first", "last"), ends(c[f"heldout_{what}"]))}} for c in curves]


def learn_bands(curves: list[dict]) -> list[dict]:
    """What the figure draws of a learning job: per group of its done runs, the reward per step
    as the seeds' mean, lowest and highest (over the steps every seed has). Runs not done are
    left out: a run cut mid-way restarts from step 0, so its partial curve is not the one that
    will count."""
    import numpy as np

    done = [c for c in curves if c["status"] == "done" and c["reward"]]
    bands = []
    for group in dict.fromkeys(c["group"] for c in done):
        runs = [c["reward"] for c in done if c["group"] == group]
        steps = min(map(len, runs))
        values = np.array([r[:steps] for r in runs], dtype=float)
        bands.append({"group": group, "seeds": len(runs), "mean": values.mean(axis=0).tolist(),
                      "low": values.min(axis=0).tolist(), "high": values.max(axis=0).tolist()})
    return bands


def learn_axes(ax, bands: list[dict], waiting: int, title: str) -> None:
    """Reward per step: per group the mean over its seeds (a line), and the seeds' range (a
    band) where it has more than one; ``waiting`` runs not done are counted in the title."""
    for band in bands:
        steps = range(len(band["mean"]))
        n = band["seeds"]
        line, = ax.plot(steps, band["mean"], label=f"{band['group']} ({n} seed{'s' * (n > 1)})")
        if n > 1:
            ax.fill_between(steps, band["low"], band["high"], color=line.get_color(), alpha=0.2)
    ax.set_title(title + (f" ({waiting} run{'s' * (waiting > 1)} not done, not drawn)" if waiting else ""), fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("reward (partial credit)")
    if bands:
        ax.legend(fontsize=6)


def study_figure(gap: list[dict], learning: dict[str, dict], path: Path) -> bool:
    """The study on one figure (the README's): the step-0 sequence KL against length, then the
    reward per step of each learning job (``learning``: job -> its ``bands`` and ``progress``,
    as long_study_jobs.job_results extracts them). False when there is nothing to draw."""
    from matplotlib.figure import Figure

    waiting = {job: sum(r["status"] != "done" for r in drawn.get("progress", [])) for job, drawn in learning.items()}
    jobs = [job for job, drawn in learning.items() if drawn.get("bands") or waiting[job]]
    if not gap and not jobs:
        return False
    panels = (1 if gap else 0) + len(jobs)
    fig = Figure(figsize=(5 * panels, 4))
    k = 1
    if gap:
        ax = fig.add_subplot(1, panels, k)
        gap_axes(ax, gap, GROWTH_LEVELS[1])
        ax.legend(fontsize=6)
        k += 1
    for job in jobs:
        learn_axes(fig.add_subplot(1, panels, k), learning[job]["bands"], waiting[job], f"{job}: reward per step")
        k += 1
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True

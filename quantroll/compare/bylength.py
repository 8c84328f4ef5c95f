"""Reward, held-out accuracy and every gap metric per response-length bucket, per group.

The published FP8-rollout failures are a function of length (matched BF16 below ~4K
tokens, drifted at 8K, collapsed at 16K), and a batch's overall numbers are dominated by
whichever lengths it happens to hold. So the report splits each group by length bucket
(powers of two: ``b`` holds lengths ``b <= L < 2b``) on every axis the runs record:

- training reward and accuracy (``reward_by_len`` of each step), over all steps and over
  the last steps (perrun.reward_window), bucketed by the reference answer's length;
- held-out reward and greedy accuracy of the engine's and the trainer's policy
  (``eval_<side>_by_len``) at the first and at the last evaluation, by reference length;
- the six gap metrics that recombine (metrics/by_length.BUCKET_METRICS) at step 0 and
  over all steps (``by_response_len``), bucketed by the generated response's length.

One value per run and bucket (n-weighted over steps; gap metrics token- or
sequence-weighted, metrics/by_length.combine_buckets), then mean ± std over the group's
seeds, as every other group number. Pure: steps in, a dict for summary.json out.
"""

from __future__ import annotations

from quantroll.compare.perrun import reward_window
from quantroll.compare.stats import as_float, stats
from quantroll.compare.cells import SHORT, Table, cell
from quantroll.metrics.by_length import BUCKET_METRICS, combine_buckets

SIDES = ("engine", "trainer")
NOTE = ("reward and held-out numbers are bucketed by the reference answer's length (tokens + EOS), the gap by the "
        "generated response's length; per run: n-weighted over steps (gap: token- or sequence-weighted), then "
        "mean ± std over seeds")


def _rewards(records: list[dict]) -> dict[str, dict]:
    """Steps' ``{bucket: {"n", "reward", "accuracy"}}`` merged, each weighted by its n."""
    sums: dict[str, list[float]] = {}
    for rec in records:
        for bucket, b in (rec or {}).items():
            n, reward, acc = as_float(b.get("n")), as_float(b.get("reward")), as_float(b.get("accuracy"))
            if not n or reward is None or acc is None:
                continue
            s = sums.setdefault(bucket, [0.0, 0.0, 0.0])
            s[0] += n
            s[1] += n * reward
            s[2] += n * acc
    return {k: {"n": int(n), "reward": r / n, "accuracy": a / n} for k, (n, r, a) in sorted(sums.items(),
                                                                                           key=lambda kv: int(kv[0]))}


def run_by_length(steps: list[dict]) -> dict:
    """One run's numbers per bucket (see the module docstring)."""
    def by_len(s: dict, key: str) -> dict:
        value = s.get(key)
        return value if isinstance(value, dict) else {}

    evals = [s for s in steps if any(by_len(s, f"eval_{side}_by_len") for side in SIDES)]
    step0 = next((s for s in steps if s.get("step") == 0), None)
    return {
        "reward": _rewards([by_len(s, "reward_by_len") for s in steps]),
        "reward_last": _rewards([by_len(s, "reward_by_len") for s in steps[-reward_window(len(steps)):]]),
        "eval_first": {side: _rewards([by_len(evals[0], f"eval_{side}_by_len")]) for side in SIDES} if evals else {},
        "eval_last": {side: _rewards([by_len(evals[-1], f"eval_{side}_by_len")]) for side in SIDES} if evals else {},
        "eval_steps": [evals[0]["step"], evals[-1]["step"]] if evals else [],
        "gap_step0": combine_buckets([by_len(step0, "by_response_len")]) if step0 else {},
        "gap": combine_buckets([by_len(s, "by_response_len") for s in steps]),
    }


def group_by_length(per_run: list[dict]) -> dict:
    """``{"buckets": {bucket: {...}}, "eval_steps": [...]}``: stats over runs per bucket;
    a run without a bucket counts in no stats of it (its ``n`` says how many did)."""
    keys = sorted({k for r in per_run for part in ("reward", "gap") for k in r[part]}
                  | {k for r in per_run for when in ("eval_first", "eval_last") for side in r[when].values()
                     for k in side}, key=int)

    def over(get) -> dict:
        return stats(get(r) for r in per_run)

    buckets = {}
    for k in keys:
        b = {"samples": sum(r["reward"].get(k, {}).get("n", 0) for r in per_run),
             "reward": over(lambda r: r["reward"].get(k, {}).get("reward")),
             "accuracy": over(lambda r: r["reward"].get(k, {}).get("accuracy")),
             "reward_last": over(lambda r: r["reward_last"].get(k, {}).get("reward")),
             "gap_tokens": sum(r["gap"].get(k, {}).get("tokens", 0) for r in per_run),
             "gap_step0": {m: over(lambda r: r["gap_step0"].get(k, {}).get(m)) for m in BUCKET_METRICS},
             "gap": {m: over(lambda r: r["gap"].get(k, {}).get(m)) for m in BUCKET_METRICS}}
        for when in ("eval_first", "eval_last"):
            for side in SIDES:
                for what in ("accuracy", "reward"):
                    b[f"{when}_{side}_{what}"] = over(lambda r: r[when].get(side, {}).get(k, {}).get(what))
            b[f"{when}_problems"] = max((r[when].get(SIDES[0], {}).get(k, {}).get("n", 0) for r in per_run), default=0)
        buckets[k] = b
    return {"buckets": buckets, "eval_steps": sorted({s for r in per_run for s in r["eval_steps"]})}


def attach_by_length(groups: list[dict], runs) -> None:
    """Add ``by_length`` to each group dict (summary.json), from the runs its run_ids name."""
    steps_of = {r.run_id: r.steps for r in runs}
    for g in groups:
        g["by_length"] = group_by_length([run_by_length(steps_of[i]) for i in g["run_ids"] if steps_of.get(i)])


def _arrow(a: dict | None, b: dict | None) -> str:
    return f"{cell(a)} → {cell(b)}"


def by_length_tables(summary: dict) -> list[Table]:
    """One report table per group that has length buckets: a row per bucket with its
    reward, held-out accuracy (first → last evaluation) and each gap metric (step 0 →
    mean over steps)."""
    tables = []
    for g in summary.get("groups", []):
        data = g.get("by_length") or {}
        buckets = data.get("buckets") or {}
        if not buckets:
            continue
        steps = data.get("eval_steps") or []
        rows = [[f"{k}-{2 * int(k) - 1}", str(b["samples"]), cell(b["reward"]), cell(b["reward_last"]),
                 cell(b["accuracy"]),
                 _arrow(b["eval_first_engine_accuracy"], b["eval_last_engine_accuracy"]),
                 _arrow(b["eval_first_trainer_accuracy"], b["eval_last_trainer_accuracy"]),
                 f"{cell(b['eval_last_engine_reward'])} / {cell(b['eval_last_trainer_reward'])}",
                 str(b["gap_tokens"])] + [_arrow(b["gap_step0"][m], b["gap"][m]) for m in BUCKET_METRICS]
                for k, b in buckets.items()]
        legend = [("bucket", "lengths b to 2b-1 in tokens"),
                  ("samples", "rollout samples in the bucket, summed over steps and runs"),
                  ("reward / last steps / accuracy", "training reward over all steps, over the last steps, and the "
                   "share of samples with reward >= 1"),
                  ("held-out acc", f"greedy accuracy on held-out problems, first → last evaluation (steps "
                   f"{', '.join(map(str, steps)) or 'none'})"),
                  ("held-out reward", "engine / trainer policy, at the last evaluation"),
                  ("gap", "each metric at step 0 → mean over all steps; metrics as in the gap tables")]
        tables.append(Table(f"by_length:{g['id']}", f"By length: {g['label']} / {g['correction']}",
                            ["bucket", "samples", "reward", "reward last steps", "accuracy", "held-out acc engine",
                             "held-out acc trainer", "held-out reward engine / trainer", "gap tokens"]
                            + [SHORT.get(m, m) for m in BUCKET_METRICS], rows, legend, [NOTE]))
    return tables

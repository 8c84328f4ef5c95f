"""The study of a `quantroll compare` matrix as one JSON-serializable dict (summary.json).

Pure: finished run directories in (see rundata.load_runs), numbers out. Only runs with
status "done" and at least one step are aggregated; every run, failed ones with their
error, appears in ``runs``. Layout of the result:

  gap_metrics, main_gap, notes{warmup, break_even, significance}, baseline (group id),
  groups[]: identity, gap_step0/gap_mean{metric: stats}, metrics_mean, curves, reward (step 0,
            mean, first and last k steps, k), eval, routing, time, memory, speed (vs baseline),
            reward_vs_bf16
  sweep[]: identity + response_len + gap_step0{metric: stats}
  runs[]: one row per run; failed[]: the failed ones; recommendation{rule, modes, verdicts}
  (each mode: its choice, whether it is acceptable vs BF16, the evidence, one answer line);
  checkpoints[]: what each checkpoint of the study kept in high precision (inventory.py);
  warnings[]: what the reader should know about the data (dropped lines, missing baseline);
  heldout_baseline: did BF16's held-out accuracy hold from step 0 to the last eval (heldout.py);
  heldout_warnings[]: a baseline that unlearned, a training reward that rose while held-out
  accuracy did not: they qualify the answer, so the report prints them right under it.

A "stats" is {"mean", "std" (over seeds, ddof=1, None with one seed), "n"}.
"""

from __future__ import annotations

from quantroll.compare.bylength import attach_by_length
from quantroll.compare.groups import build_groups, build_sweep, is_emulated, spec_key
from quantroll.compare.heldout import baseline_check, baseline_warning, memorisation_warnings
from quantroll.compare.labels import display
from quantroll.compare.perrun import GAP_METRICS, MAIN_GAP, run_values
from quantroll.compare.recommend import recommend
from quantroll.compare.rundata import RunData, load_runs
from quantroll.compare.speed import ASSUMPTION, WARMUP_NOTE, break_even
from quantroll.compare.stats import difference

__all__ = ["RunData", "load_runs", "summarize", "run_row"]

SCHEMA_VERSION = 3  # 3: reward "final" and the "accuracy" block gone (last_steps, last_k); heldout_*
SIGNIFICANCE = ("a difference between two groups counts only if |mean_a - mean_b| > sqrt(std_a^2 + std_b^2), "
                "std over seeds (ddof=1); with one seed the spread is unknown")


def run_row(run: RunData) -> dict:
    """One line of the per-run table: identity, status, error and the key numbers."""
    s = run.spec
    label, precision, unified, correction, kv, _ = spec_key(s)
    emulated = is_emulated(run)
    row = {
        "run_id": run.run_id, "status": s.get("status"), "error": s.get("error"),
        "mode": label, "label": display(label, emulated), "precision": precision,
        "unified": unified, "correction": correction, "kv_cache_dtype": kv, "seed": s.get("seed"), "response_len": s.get("response_len"),
        "sweep": bool(s.get("sweep")), "emulated": emulated, "moe": bool(s.get("moe")),
        "device": s.get("device"), "model": s.get("model"), "wall_time_s": s.get("wall_time_s"),
        "num_steps": len(run.steps), "truncated_last_line": run.truncated_last_line, "bad_lines": list(run.bad_lines),
        "gap_step0": None, "gap_mean": None, "reward_mean": None, "reward_last": None,
        "rollout_time": None, "train_time": None, "peak_memory_gib": None,
    }
    if run.steps:
        v = run_values(run.steps)
        row.update(gap_step0=v["gap_step0"][MAIN_GAP], gap_mean=v["gap_mean"][MAIN_GAP],
                   reward_mean=v["means"].get("reward_mean"), reward_last=v["reward_last"],
                   rollout_time=v["times"]["rollout_time"], train_time=v["times"]["train_time"],
                   peak_memory_gib=v["memory"]["peak_memory_gib"])
    return row


def _baseline(groups: list[dict]) -> dict | None:
    bf16 = [g for g in groups if g.get("baseline", g["precision"] == "bf16")]
    return next((g for g in bf16 if g["correction"] == "none"), bf16[0] if bf16 else None)


def _warnings(runs: list[RunData], groups: list[dict], base: dict | None) -> list[str]:
    out = []
    for r in runs:
        if r.bad_lines:
            out.append(f"{r.run_id}: unparsable metrics lines {list(r.bad_lines)} skipped")
        if r.spec.get("status") == "done" and not r.steps:
            out.append(f"{r.run_id}: status done but no metrics: left out")
    running = [r.run_id for r in runs if r.spec.get("status") not in ("done", "failed")]
    if running:
        out.append(f"not finished, left out: {', '.join(running)}")
    shared = [r for r in runs if (r.spec.get("placement") or {}).get("shared_device")]
    if shared:
        jobs = max(r.spec["placement"].get("jobs") or 0 for r in shared)
        out.append(f"{len(shared)} of {len(runs)} runs shared their device with other runs (compare --jobs {jobs}): their "
                   "times include the others' work, so the time, speedup and break-even columns are not speed "
                   "figures (rerun with --jobs 1, or one GPU a run, to measure speed)")
    for g in groups:
        if len(g["response_lens"]) > 1:
            out.append(f"{g['id']}: runs differ in response length {g['response_lens']}: no break-even length")
    if groups and base is None:
        out.append("no bf16 baseline group: speedups, break-even and reward differences are not computed")
    return out


def summarize(runs: list[RunData], checkpoints: list[dict] | None = None) -> dict:
    """The summary.json content for these runs (pure; JSON-serializable, no NaN);
    ``checkpoints``: the inventory of the study's checkpoints (inventory.load_inventory)."""
    done = [r for r in runs if r.spec.get("status") == "done" and r.steps]
    groups = build_groups([r for r in done if not r.spec.get("sweep")])
    base = _baseline(groups)
    attach_by_length(groups, done)  # each group's reward, held-out accuracy and gap per length bucket (bylength.py)
    for g in groups:
        g["speed"] = break_even(g, base) if base and g is not base else None
        g["reward_vs_bf16"] = difference(g["reward"]["mean"], base["reward"]["mean"]) if base and g is not base else None
    rows = [run_row(r) for r in runs]
    check = baseline_check(base)
    return {
        "schema_version": SCHEMA_VERSION,
        "gap_metrics": list(GAP_METRICS),
        "main_gap": MAIN_GAP,
        "notes": {"warmup": WARMUP_NOTE, "break_even": ASSUMPTION, "significance": SIGNIFICANCE},
        "baseline": base["id"] if base else None,
        "groups": groups,
        "sweep": build_sweep([r for r in done if r.spec.get("sweep")]),
        "runs": rows,
        "failed": [{k: row[k] for k in ("run_id", "label", "correction", "seed", "error")}
                   for row in rows if row["status"] == "failed"],
        "recommendation": recommend(groups, base),
        "checkpoints": list(checkpoints or []),
        "warnings": _warnings(runs, groups, base),
        "heldout_baseline": check,
        "heldout_warnings": [w for w in [baseline_warning(check)] if w] + memorisation_warnings(groups),
    }

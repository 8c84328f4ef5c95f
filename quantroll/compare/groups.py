"""Runs -> groups of seeds: one group per (mode, precision, unified, correction).

A group's every number is a statistic over its runs (one value per run, see perrun),
so the spread it carries is the seed-to-seed spread the recommendation needs. Curves
(reward and gap per step) are per-step statistics over the runs that reached the step.
Sweep runs are grouped apart, by response length too, and keep only their step-0 gap
(and its split by response-length bucket): they exist to show how the gap grows with
the length of what is generated. Every group also carries its gap per response-length
bucket over all steps (metrics/by_length.py), which the gap-vs-length plot draws.
"""

from __future__ import annotations

from quantroll.compare.labels import display, group_id, mode_label, sort_key
from quantroll.compare.perrun import (EVAL_KEYS, EXTREMES, GAP_METRICS, MAIN_GAP, MEMORY_KEYS, TIME_KEYS, reward_window,
                                      run_values)
from quantroll.compare.rundata import RunData
from quantroll.compare.stats import as_float, stats
from quantroll.metrics.by_length import BUCKET_METRICS

CURVES = ("reward_mean", MAIN_GAP, *EVAL_KEYS.values())
TRUE_ON_POLICY = " (true on-policy)"  # the label suffix of a --true-on-policy-mode group


def spec_key(spec: dict) -> tuple[str, str, bool, str, str, bool]:
    """(mode label, precision, unified, correction, KV cache dtype, BF16 exceptions) of a run spec."""
    precision = str(spec.get("precision") or "bf16")
    unified = bool(spec.get("unified")) and precision != "bf16"
    correction = str(spec.get("correction") or "none")
    kv = str(spec.get("kv_cache_dtype") or "bf16")
    exceptions = bool(spec.get("bf16_exceptions")) and precision != "bf16"
    label = mode_label(precision, unified, kv, exceptions) + (TRUE_ON_POLICY if spec.get("true_on_policy") else "")
    return label, precision, unified, correction, kv, exceptions


def is_emulated(run: RunData) -> bool:
    """run.json says so, or the engine did: its rollout_precision reads e.g. "mxfp8 (emulated)"."""
    return bool(run.spec.get("emulated")) or any("emulated" in str(s.get("rollout_precision", "")) for s in run.steps)


def _distinct(values) -> list:
    out = []
    for v in values:
        if v is not None and v not in out:
            out.append(v)
    return out


def curve(step_lists: list[list[dict]], key: str) -> list[dict]:
    """Per step: stats over the runs that have the step."""
    by_step: dict[int, list] = {}
    for steps in step_lists:
        for s in steps:
            by_step.setdefault(s["step"], []).append(s.get(key))
    points = [{"step": step, **stats(vals)} for step, vals in sorted(by_step.items())]
    return [p for p in points if p["n"]] if key in EVAL_KEYS.values() else points  # eval: only where measured


def by_length(per_run: list[dict]) -> dict[str, dict]:
    """Per response-length bucket: tokens and sequences summed over the runs, each metric
    as stats over the runs that have the bucket (one token-weighted value per run)."""
    keys = sorted({k for b in per_run for k in b}, key=int)
    return {k: {"tokens": sum(b[k]["tokens"] for b in per_run if k in b),
                "seqs": sum(b[k]["seqs"] for b in per_run if k in b),
                **{m: stats(b[k].get(m) for b in per_run if k in b) for m in BUCKET_METRICS}} for k in keys}


def _identity(key: tuple, runs: list[RunData]) -> dict:
    label, precision, unified, correction, kv, exceptions = key
    specs = [r.spec for r in runs]
    emulated = any(is_emulated(r) for r in runs)
    extra = {"bf16_exceptions": True} if exceptions else {}  # absent otherwise: default summaries unchanged
    return {**extra,
        "id": group_id(label, correction), "mode": label, "label": display(label, emulated),
        "precision": precision, "unified": unified, "correction": correction, "emulated": emulated,
        "kv_cache_dtype": kv, "true_on_policy": label.endswith(TRUE_ON_POLICY),
        "baseline": precision == "bf16" and kv == "bf16" and not label.endswith(TRUE_ON_POLICY),
        "moe": any(bool(s.get("moe")) for s in specs),
        "run_ids": [r.run_id for r in runs], "seeds": [s.get("seed") for s in specs], "n_runs": len(runs),
        "devices": _distinct(s.get("device") for s in specs), "models": _distinct(s.get("model") for s in specs),
    }


def aggregate(key: tuple, runs: list[RunData]) -> dict:
    """The group dict of summary.json (identity, gap, reward, eval, routing, time, memory)."""
    vals = [run_values(r.steps) for r in runs]
    lens = sorted(_distinct(r.spec.get("response_len") for r in runs))
    metric_names = sorted({k for v in vals for k in v["means"]})
    layers = sorted({n for v in vals for n in v["routing_mean"]})
    evals = [v["eval"] for v in vals if v["eval"]]
    ks = _distinct(reward_window(v["num_steps"]) for v in vals)  # k of "reward over the last k steps"
    group = _identity(key, runs)
    group.update({
        "response_lens": lens,
        "response_len": lens[0] if len(lens) == 1 else None,
        "num_steps": max(v["num_steps"] for v in vals),
        "loss_agg": _distinct(v["loss_agg"] for v in vals),
        "rollout_precision": _distinct(v["rollout_precision"] for v in vals),
        "gap_step0": {k: stats(v["gap_step0"][k] for v in vals) for k in GAP_METRICS},
        "gap_mean": {k: stats(v["gap_mean"][k] for v in vals) for k in GAP_METRICS},
        "entropy": {"gap_step0": stats(v["step0"].get("entropy") for v in vals),
                    "gap_mean": stats(v["means"].get("entropy") for v in vals)},
        "metrics_mean": {k: stats(v["means"].get(k) for v in vals) for k in metric_names},
        "curves": {k: curve([r.steps for r in runs], k) for k in CURVES},
        "reward": {"mean": stats(v["means"].get("reward_mean") for v in vals),
                   "step0": stats(v["step0"].get("reward_mean") for v in vals),
                   "first_steps": stats(v["reward_first"] for v in vals),
                   "last_steps": stats(v["reward_last"] for v in vals),
                   "last_k": ks[0] if len(ks) == 1 else None},
        "eval": ({"engine": stats(e["engine"] for e in evals), "trainer": stats(e["trainer"] for e in evals),
                  "steps": sorted(_distinct(e["step"] for e in evals)),
                  "first_engine": stats(e["first_engine"] for e in evals),
                  "first_trainer": stats(e["first_trainer"] for e in evals),
                  "first_steps": sorted(_distinct(e["first_step"] for e in evals))} if evals else None),
        "extremes": {k: pick((v["extremes"][k] for v in vals if v["extremes"][k] is not None), default=None)
                     for k, pick in EXTREMES.items()},
        "gap_by_len": by_length([v["by_len"] for v in vals]),
        "routing": ({"layers": layers,
                     "step0": {str(n): stats(v["routing_step0"].get(n) for v in vals) for n in layers},
                     "mean": {str(n): stats(v["routing_mean"].get(n) for v in vals) for n in layers}}
                    if layers else None),
        "time": {
            **{k: stats(v["times"][k] for v in vals) for k in TIME_KEYS},
            "rollout_tokens_per_s": stats(v["rollout_tokens_per_s"] for v in vals),
            "tokens_per_step": stats(v["tokens_per_step"] for v in vals),
            "s_per_token": stats(v["s_per_token"] for v in vals),
            "warmup_excluded": all(v["num_steps"] > 1 for v in vals),
        },
        "memory": {k: stats(v["memory"][k] for v in vals) for k in MEMORY_KEYS},
    })
    return group


def build_groups(runs: list[RunData]) -> list[dict]:
    buckets: dict[tuple, list[RunData]] = {}
    for r in runs:
        buckets.setdefault(spec_key(r.spec), []).append(r)
    order = sorted(buckets, key=lambda k: sort_key(k[1], k[2], k[3], k[4], k[5]))
    return [aggregate(k, buckets[k]) for k in order]


def build_sweep(runs: list[RunData]) -> list[dict]:
    """Step-0 gap vs response length, per (mode, correction) and length, stats over seeds."""
    buckets: dict[tuple, list[RunData]] = {}
    for r in runs:
        buckets.setdefault((*spec_key(r.spec), r.spec.get("response_len")), []).append(r)

    def order(k):
        return (sort_key(k[1], k[2], k[3], k[4], k[5]), as_float(k[6]) or 0.0)

    rows = []
    for k in sorted(buckets, key=order):
        members = buckets[k]
        step0 = [next((s for s in r.steps if s.get("step") == 0), {}) for r in members]
        rows.append({
            **_identity(k[:6], members),
            "response_len": k[6],
            "gap_step0": {m: stats(s.get(m) for s in step0) for m in GAP_METRICS},
            "gap_by_len": by_length([run_values(r.steps)["by_len"] for r in members]),
        })
    return rows

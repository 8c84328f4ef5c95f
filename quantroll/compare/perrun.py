"""The numbers of one run, each reduced to one value so that groups can take stats over seeds.

Step 0 is special twice over: its gap is measured on the initial weights (before any
update: the pure precision effect), and its times include warm-up (first allocations,
kernel compilation, caches). So the gap is reported at step 0 and as a mean over all
steps, while per-step times are means over the steps after the first whenever a run has
more than one step.
"""

from __future__ import annotations

import re

from quantroll.compare.stats import as_float, finite, mean
from quantroll.metrics.by_length import combine_buckets
from quantroll.metrics.mismatch import METRIC_NAMES

GAP_METRICS = METRIC_NAMES  # the mismatch metrics (docs/metrics.md): the train/rollout gap of a step
MAIN_GAP = "train_rollout_logprob_abs_diff"
NON_METRICS = frozenset({"step", "rollout_precision", "weight_version", "mismatch_tokens", "mismatch_seqs"})
TIME_KEYS = ("rollout_time", "train_time", "weight_quantize_time", "weight_load_time", "weight_copy_time")
# GiB (2**30 bytes); weights counted at the dtype they are stored in (rl/memory.py)
MEMORY_KEYS = ("peak_memory_gib", "engine_weight_gib", "trainer_weight_gib", "trainer_optimizer_gib",
               "kv_cache_capacity_tokens")
EVAL_KEYS = {"engine": "eval_engine_accuracy", "trainer": "eval_trainer_accuracy"}
# per-step extremes that stay extremes over a run (the range of the TIS ratios)
EXTREMES = {"tis_ratio_min": min, "tis_ratio_max": max}
ROUTING = re.compile(r"^routing_agreement_layer(\d+)$")


def metric_keys(steps: list[dict]) -> list[str]:
    """Every key that holds a number (or the sink's "nan"/"inf") in some step."""
    keys: dict[str, None] = {}
    for s in steps:
        for k, v in s.items():
            if k not in NON_METRICS and as_float(v) is not None:
                keys[k] = None
    return sorted(keys)


def routing_layers(steps: list[dict]) -> list[int]:
    return sorted({int(m.group(1)) for s in steps for k in s if (m := ROUTING.match(k))})


def timed_steps(steps: list[dict]) -> list[dict]:
    """The steps whose times count: all but the first (warm-up), unless there is only one."""
    return steps[1:] if len(steps) > 1 else steps


def _tokens(step: dict) -> float | None:
    """Tokens generated in a step: the loop writes tokens/s = tokens / rollout_time."""
    t, tps = as_float(step.get("rollout_time")), as_float(step.get("rollout_tokens_per_s"))
    if t is None or tps is None:
        return None
    return t * tps


def reward_window(num_steps: int) -> int:
    """Steps averaged at each end of a run to say whether its reward rose: one step's reward
    is too noisy to compare (5 steps, or a quarter of a short run)."""
    return max(1, min(5, num_steps // 4))


def run_values(steps: list[dict]) -> dict:
    """One value per quantity for a run with at least one step."""
    step0 = next((s for s in steps if s.get("step") == 0), {})
    last = steps[-1]
    timed = timed_steps(steps)
    keys = metric_keys(steps)
    pairs = [(as_float(s.get("rollout_time")), _tokens(s)) for s in timed]
    pairs = [(t, n) for t, n in pairs if len(finite([t, n])) == 2 and n > 0]
    evals = [s for s in steps if finite([s.get(EVAL_KEYS["engine"])]) or finite([s.get(EVAL_KEYS["trainer"])])]
    layers = routing_layers(steps)
    return {
        "num_steps": len(steps),
        "reward_first": mean(s.get("reward_mean") for s in steps[: reward_window(len(steps))]),
        "reward_last": mean(s.get("reward_mean") for s in steps[-reward_window(len(steps)):]),
        "means": {k: mean(s.get(k) for s in steps) for k in keys},
        "step0": {k: as_float(step0.get(k)) for k in keys},
        "gap_step0": {k: as_float(step0.get(k)) for k in GAP_METRICS},
        "gap_mean": {k: mean(s.get(k) for s in steps) for k in GAP_METRICS},
        "times": {k: mean(s.get(k) for s in timed) for k in TIME_KEYS},
        "rollout_tokens_per_s": mean(s.get("rollout_tokens_per_s") for s in timed),
        "tokens_per_step": mean(n for _, n in pairs),
        "s_per_token": sum(t for t, _ in pairs) / sum(n for _, n in pairs) if pairs else None,
        "eval": ({"step": evals[-1]["step"], "engine": as_float(evals[-1].get(EVAL_KEYS["engine"])),
                  "trainer": as_float(evals[-1].get(EVAL_KEYS["trainer"])),
                  "first_step": evals[0]["step"], "first_engine": as_float(evals[0].get(EVAL_KEYS["engine"])),
                  "first_trainer": as_float(evals[0].get(EVAL_KEYS["trainer"]))} if evals else None),
        "extremes": {k: pick(finite(s.get(k) for s in steps), default=None) for k, pick in EXTREMES.items()},
        "by_len": combine_buckets([s["by_response_len"] for s in steps if isinstance(s.get("by_response_len"), dict)]),
        "routing_step0": {n: as_float(step0.get(f"routing_agreement_layer{n}")) for n in layers},
        "routing_mean": {n: mean(s.get(f"routing_agreement_layer{n}") for s in steps) for n in layers},
        "memory": {
            "peak_memory_gib": max(finite(s.get("peak_memory_gib") for s in steps), default=None),
            **{k: mean(s.get(k) for s in steps) for k in MEMORY_KEYS if k != "peak_memory_gib"},
        },
        "loss_agg": last.get("loss_agg"),
        "rollout_precision": last.get("rollout_precision"),
    }

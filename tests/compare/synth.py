"""Synthetic `quantroll compare` output directories for the report tests.

Numbers come from a seeded generator; the tests never hard-code expected values but
recompute them from the JSONL written here (see ``raw_steps``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

GAP_KEYS = (
    "train_rollout_logprob_abs_diff", "train_rollout_kl", "log_ppl_diff", "ppl_ratio", "chi2_token", "chi2_seq",
    "train_rollout_prob_abs_diff_max", "train_rollout_prob_abs_diff_mean", "train_rollout_prob_pearson",
)
OTHER_KEYS = (
    "reward_mean", "reward_std", "accuracy", "response_len_mean", "loss", "pg_clipfrac", "grad_norm", "train_time",
    "tis", "tis_clipfrac", "tis_abs", "ess_ratio", "masked_fraction", "tis_count", "rollout_time",
    "rollout_tokens_per_s", "weight_quantize_time", "weight_load_time", "weight_copy_time", "peak_memory_gib",
    "entropy",
)
BUCKET_KEYS = ("train_rollout_logprob_abs_diff", "train_rollout_kl", "chi2_token", "log_ppl_diff", "ppl_ratio",
               "chi2_seq")
# (precision, unified, correction, emulated, gap scale, rollout seconds, quantize seconds)
GROUPS = (
    ("bf16", False, "none", False, 0.002, 2.0, 0.00),
    ("fp8", False, "none", False, 0.05, 1.5, 0.30),
    ("fp8", False, "tis", False, 0.05, 1.5, 0.30),
    ("fp8", True, "none", False, 0.01, 1.6, 0.35),
    ("mxfp8", True, "mask", True, 0.02, 3.0, 0.50),
)
SEEDS = (0, 1, 2)
NUM_STEPS = 6
EVAL_EVERY = 3
MOE_LAYERS = (0, 2)
RESPONSE_LEN = 16


def write_run(out: Path, spec: dict, steps: list[dict], tail: str = "") -> Path:
    d = out / "runs" / spec["run_id"]
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.json").write_text(json.dumps(spec))
    text = "".join(json.dumps(s) + "\n" for s in steps) + tail
    (d / "metrics.jsonl").write_text(text)
    return d


def spec(run_id, precision, unified, correction, seed, *, emulated=False, sweep=False, status="done", error=None,
         response_len=RESPONSE_LEN, moe=True):
    return {"run_id": run_id, "precision": precision, "unified": unified, "correction": correction, "seed": seed,
            "response_len": response_len, "sweep": sweep, "emulated": emulated, "status": status, "error": error,
            "wall_time_s": 12.5, "device": "cpu", "model": "built-in tiny qwen3", "moe": moe}


def random_steps(rng, n, gap, rollout_s, quant_s, precision, response_len=RESPONSE_LEN, eval_every=EVAL_EVERY):
    steps = []
    for step in range(n):
        s = {"step": step, "rollout_precision": precision, "loss_agg": "token-mean", "weight_version": step + 1,
             "mismatch_tokens": int(rng.integers(50, 100)), "mismatch_seqs": 8}
        s.update({k: float(gap * rng.uniform(0.5, 1.5)) for k in GAP_KEYS})
        s.update({k: float(rng.uniform(0.1, 1.0)) for k in OTHER_KEYS})
        s["reward_mean"] = float(rng.uniform(0, 1) + 0.05 * step)
        s["rollout_time"] = float(rollout_s * rng.uniform(0.9, 1.1) * (3.0 if step == 0 else 1.0))  # warm-up
        s["rollout_tokens_per_s"] = float(8 * response_len * rng.uniform(0.6, 1.0) / s["rollout_time"])
        s["weight_quantize_time"] = float(quant_s * rng.uniform(0.9, 1.1))
        s["weight_load_time"] = float(0.05 * rng.uniform(0.9, 1.1))
        s["kv_cache_capacity_tokens"] = float(rng.integers(1000, 2000))
        s["tis_ratio_min"] = float(rng.uniform(0.5, 1.0))
        s["tis_ratio_max"] = float(rng.uniform(1.0, 2.0))
        for layer in MOE_LAYERS:
            s[f"routing_agreement_layer{layer}"] = float(1.0 - gap * rng.uniform(0, 2))
        if eval_every and (step % eval_every == 0 or step == n - 1):  # as the loop does (rl/loop.eval_due)
            s["eval_engine_accuracy"] = float(rng.uniform(0, 1))
            s["eval_trainer_accuracy"] = float(rng.uniform(0, 1))
        buckets = [b for b in (1, 2, 4, 8, 16) if b <= response_len and rng.uniform() < 0.8] or [1]
        s["by_response_len"] = {str(b): {"tokens": int(rng.integers(b, 10 * b)), "seqs": int(rng.integers(1, 6)),
                                         **{k: float(gap * b * rng.uniform(0.5, 1.5)) for k in BUCKET_KEYS}}
                                for b in buckets}
        steps.append(s)
    return steps


def build_matrix(out: Path, seed: int = 1234) -> Path:
    """The full matrix: GROUPS x SEEDS, a failed run, a running one, a truncated file, a NaN, sweep runs."""
    rng = np.random.default_rng(seed)
    for precision, unified, corr, emulated, gap, rollout_s, quant_s in GROUPS:
        for s in SEEDS:
            run_id = f"{precision}-{'u' if unified else 'r'}-{corr}-s{s}"
            steps = random_steps(rng, NUM_STEPS, gap, rollout_s, quant_s, precision)
            tail = ""
            if (precision, corr, s) == ("fp8", "tis", 1):
                tail = '{"step": 6, "reward_mean": 0.'  # killed mid-write
            if (precision, corr, s) == ("fp8", "none", 2):
                steps[3]["grad_norm"] = "nan"  # the sink's spelling of NaN
            write_run(out, spec(run_id, precision, unified, corr, s, emulated=emulated), steps, tail)
    failed = spec("nvfp4-u-none-s0", "nvfp4", True, "none", 0, emulated=True, status="failed",
                  error="RuntimeError: NaN loss at step 1 <script>alert(1)</script>")
    write_run(out, failed, random_steps(rng, 2, 0.3, 4.0, 0.6, "nvfp4"))
    write_run(out, spec("fp8-r-r3-s0", "fp8", False, "r3", 0, status="running"), random_steps(rng, 1, 0.05, 1.5, 0.3, "fp8"))
    for precision, gap in (("bf16", 0.002), ("fp8", 0.05)):
        for length in (8, 32, 128):
            for s in (0, 1):
                sp = spec(f"sweep-{precision}-L{length}-s{s}", precision, False, "none", s, sweep=True, response_len=length)
                write_run(out, sp, random_steps(rng, 1, gap * np.log2(length), 1.0, 0.1, precision, length))
    return out


def write_constant_runs(out: Path, values: dict[str, list[tuple]], extra: dict[str, dict] | None = None) -> Path:
    """values: fp8 mode-1 correction (or 'bf16') -> one (gap, reward[, held-out accuracy]) per seed; 3 equal
    steps per run, evaluated at steps 0 and 2 when an accuracy is given. ``extra``: per correction, more keys
    for every step (e.g. the TIS metrics)."""
    for corr, per_seed in values.items():
        precision, correction = ("bf16", "none") if corr == "bf16" else ("fp8", corr)
        for seed, (gap, reward, *acc) in enumerate(per_seed):
            steps = [{"step": i, "train_rollout_logprob_abs_diff": gap, "reward_mean": reward, "rollout_time": 1.0,
                      "rollout_tokens_per_s": 10.0, "weight_quantize_time": 0.1, "weight_load_time": 0.1,
                      "train_time": 0.5, **(extra or {}).get(corr, {})} for i in range(3)]
            if acc:
                for i in (0, 2):
                    steps[i].update(eval_engine_accuracy=acc[0], eval_trainer_accuracy=acc[0])
            write_run(out, spec(f"{corr}-{seed}", precision, False, correction, seed, moe=False), steps)
    return out


def raw_steps(run_dir: Path) -> list[dict]:
    """Independent reader for the tests: every line that parses, as written."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def raw_runs(out: Path) -> dict[str, tuple[dict, list[dict]]]:
    return {d.name: (json.loads((d / "run.json").read_text()), raw_steps(d)) for d in sorted((out / "runs").iterdir())}

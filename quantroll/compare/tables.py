"""summary.json -> tables as plain cells, rendered later as Markdown, HTML or terminal text.

Building the cells once keeps the three renderings identical in content; each table
carries a legend that explains every metric it shows in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantroll.compare.perrun import MAIN_GAP
from quantroll.compare.speed import update_over_copy

LEGEND = {
    "train_rollout_logprob_abs_diff": "mean over response tokens of |logp_train - logp_rollout| (the main gap)",
    "train_rollout_kl": "mean of exp(r) - 1 - r, r = logp_train - logp_rollout: k3 estimate of KL(rollout || train)",
    "log_ppl_diff": "mean over sequences of log ppl_train - log ppl_rollout",
    "ppl_ratio": "mean over sequences of ppl_train / ppl_rollout",
    "chi2_token": "mean(exp(2r)) - 1 over tokens: variance of token importance weights",
    "chi2_seq": "the same over per-sequence ratio products: variance of sequence-level weights",
    "train_rollout_prob_abs_diff_max": "max |p_train - p_rollout| of the sampled tokens",
    "train_rollout_prob_abs_diff_mean": "mean |p_train - p_rollout| of the sampled tokens",
    "train_rollout_prob_pearson": "Pearson correlation of p_train and p_rollout over tokens",
    "n": "seeds (runs) aggregated; values are mean ± std over seeds (ddof=1)",
    "reward": "mean reward over all steps of a run",
    "final reward": "reward at the last step",
    "reward - bf16": "mean reward over steps minus the bf16 baseline's, with its significance",
    "accuracy": "share of rollout samples with reward >= 1, mean over steps",
    "eval engine / trainer": ("held-out greedy accuracy (problems outside the training pool) of the engine's "
                              "(rollout precision) and the trainer's policy, at step 0 and at the last eval step"),
    "reward step 0": "reward at step 0 (initial weights)",
    "rollout / train / quantize / load": "seconds per step of generation, training, weight re-quantization and weight loading",
    "update / copy": ("weight update (quantize + load) over one device copy of the engine's weight bytes, as held "
                      "(the memory system's limit for an update; the one-GPU floor is 2x)"),
    "tokens/s": "tokens generated per second of rollout",
    "speedup": "bf16 rollout time / this rollout time (tokens/s ratio: this / bf16)",
    "saved / extra sync / net": "rollout seconds saved vs bf16, extra sync seconds vs bf16 per update, saved - extra",
    "break-even len": "response-length limit at which saved = extra sync (linear extrapolation, see the assumption)",
    "routing agreement": "share of tokens whose top-k expert set is the same in trainer and engine (1 = identical), "
                         "from the trainer's own router: what R3 replays away",
    "peak memory": "peak memory in GiB, max over steps: GPU memory allocated on CUDA, the process's resident set on CPU",
    "KV capacity": "tokens the engine's KV cache can hold",
    "engine weights": ("GiB of every weight the engine holds (codes, scales, BF16 parts), at the dtype its checkpoint "
                       "stores them in, not the float32 copy a CPU computes with"),
    "trainer weights": "GiB of the trainer's weights as stored (BF16)",
    "trainer optimizer": "GiB the optimizer holds: FP32 master weights and AdamW's two moments",
    "response len": "bucket b-(2b-1) of response lengths in tokens (b a power of two), over all steps of every run",
    "tokens": "response tokens in the bucket, summed over the group's runs",
    "held-out acc": "held-out greedy accuracy of the trainer's policy at the last eval step",
}
SHORT = {
    "train_rollout_logprob_abs_diff": "|logp diff|", "train_rollout_kl": "KL (k3)", "log_ppl_diff": "log ppl diff",
    "ppl_ratio": "ppl ratio", "chi2_token": "chi2 token", "chi2_seq": "chi2 seq",
    "train_rollout_prob_abs_diff_max": "|p diff| max", "train_rollout_prob_abs_diff_mean": "|p diff| mean",
    "train_rollout_prob_pearson": "p pearson",
}
COMPACT_GAP = (MAIN_GAP, "train_rollout_kl", "chi2_seq")
SEE_ABOVE = "columns as in the gap-at-step-0 table; values are mean ± std over seeds"


@dataclass
class Table:
    key: str
    title: str
    headers: list[str]
    rows: list[list[str]]
    legend: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def num(x, spec: str = ".3g") -> str:
    return "n/a" if x is None else format(x, spec)


def cell(s: dict | None) -> str:
    """'mean ± std' of a stats dict ('mean' alone with one seed)."""
    if not s or s.get("mean") is None:
        return "n/a"
    return f"{s['mean']:.3g}" + (f" ± {s['std']:.3g}" if s.get("std") is not None else "")


def _diff(d: dict | None) -> str:
    if not d or d.get("diff") is None:
        return "n/a"
    spread = f", spread {d['spread']:.3g}" if d.get("spread") is not None else ""
    return f"{d['diff']:+.3g} ({d['note']}{spread})"


def _legend(*keys: str) -> list[tuple[str, str]]:
    return [(k, LEGEND[k]) for k in keys]


def _gap_table(summary: dict, key: str, title: str, field_name: str, compact: bool, explain: bool) -> Table:
    """``explain``: the first gap table carries the metric legend, the later ones point back to it."""
    metrics = COMPACT_GAP if compact else summary["gap_metrics"]
    rows = [[g["label"], g["correction"], str(g["gap_step0"][MAIN_GAP]["n"])]
            + [cell(g[field_name][m]) for m in metrics] for g in summary["groups"]]
    return Table(key, title, ["group", "correction", "n"] + [SHORT.get(m, m) for m in metrics], rows,
                 _legend("n", *metrics) if explain else [], [] if explain else [SEE_ABOVE])


def groups_table(summary: dict) -> Table:
    rows = [[g["label"], g["correction"], f"{g['n_runs']} ({', '.join(map(str, g['seeds']))})", str(g["num_steps"]),
             ", ".join(map(str, g["response_lens"])), ", ".join(map(str, g["loss_agg"])) or "n/a",
             ", ".join(map(str, g["devices"])), ", ".join(map(str, g["models"]))] for g in summary["groups"]]
    return Table("groups", "Groups", ["group", "correction", "runs (seeds)", "steps", "response len", "loss agg",
                                      "device", "model"], rows)


def _eval_cell(ev: dict, first: bool) -> str:
    if not ev:
        return "n/a"
    engine, trainer = (ev["first_engine"], ev["first_trainer"]) if first else (ev["engine"], ev["trainer"])
    steps = ev["first_steps"] if first else ev["steps"]
    return f"{cell(engine)} / {cell(trainer)} (step {', '.join(map(str, steps))})"


def reward_table(summary: dict) -> Table:
    rows = []
    for g in summary["groups"]:
        ev = g["eval"] or {}
        rows.append([g["label"], g["correction"], str(g["reward"]["mean"]["n"]), cell(g["reward"]["step0"]),
                     cell(g["reward"]["mean"]), cell(g["reward"]["final"]), _diff(g["reward_vs_bf16"]),
                     cell(g["accuracy"]["mean"]), _eval_cell(ev, True), _eval_cell(ev, False)])
    return Table("reward", "Reward and held-out accuracy",
                 ["group", "correction", "n", "reward step 0", "reward", "final reward", "reward - bf16", "accuracy",
                  "eval engine / trainer, first", "eval engine / trainer, last"], rows,
                 _legend("reward step 0", "reward", "final reward", "reward - bf16", "accuracy", "eval engine / trainer"))


def time_table(summary: dict) -> Table:
    rows = []
    for g in summary["groups"]:
        t, sp = g["time"], g["speed"] or {}
        pays = {True: "yes", False: "no"}.get(sp.get("pays"), "n/a" if g["speed"] else "baseline")
        be = sp.get("break_even_response_len")
        rows.append([g["label"], g["correction"], cell(t["rollout_time"]), cell(t["train_time"]),
                     cell(t["weight_quantize_time"]), cell(t["weight_load_time"]),
                     f"{num(copies)}x" if (copies := update_over_copy(g)) is not None else "n/a",
                     cell(t["rollout_tokens_per_s"]),
                     f"{num(sp.get('speedup'))}x / {num(sp.get('tokens_per_s_ratio'))}x" if g["speed"] else "1x",
                     f"{num(sp.get('saved_s'))} / {num(sp.get('extra_sync_s'))} / {num(sp.get('net_s'))}",
                     pays, num(be, ".0f") if be is not None else (sp.get("break_even_note") or "n/a")])
    notes = [summary["notes"]["warmup"], summary["notes"]["break_even"]]
    return Table("time", "Time per step, speedup and break-even",
                 ["group", "correction", "rollout s", "train s", "quantize s", "load s", "update / copy", "tokens/s",
                  "speedup", "saved / extra sync / net s", "pays", "break-even len"], rows,
                 _legend("rollout / train / quantize / load", "update / copy", "tokens/s", "speedup",
                         "saved / extra sync / net", "break-even len"), notes)


def _ratio(a: dict | None, b: dict | None) -> str:
    x, y = (a or {}).get("mean"), (b or {}).get("mean")
    return f"{num(x / y)}x" if x is not None and y else "n/a"


def true_on_policy_table(summary: dict) -> Table | None:
    """Each --true-on-policy-mode group beside the same precision without the mode: the gap
    (step 0, mean over steps) and what the mode costs (rollout tokens/s, train s per step)."""
    rows, moe = [], False
    groups = summary["groups"]
    for g in (g for g in groups if g.get("true_on_policy")):
        twin = next((o for o in groups if not o.get("true_on_policy") and o["precision"] == g["precision"]
                     and o["unified"] == g["unified"] and o["kv_cache_dtype"] == g["kv_cache_dtype"]
                     and o["correction"] == g["correction"]), None)
        off = twin or {}
        moe = moe or g["moe"]
        t_on, t_off = g["time"], (off.get("time") or {})
        rows.append([off.get("label", "n/a"), cell((off.get("gap_step0") or {}).get(MAIN_GAP)),
                     cell(g["gap_step0"][MAIN_GAP]), cell((off.get("gap_mean") or {}).get(MAIN_GAP)),
                     cell(g["gap_mean"][MAIN_GAP]), cell(t_off.get("rollout_tokens_per_s")),
                     cell(t_on["rollout_tokens_per_s"]), _ratio(t_on["rollout_tokens_per_s"], t_off.get("rollout_tokens_per_s")),
                     cell(t_off.get("train_time")), cell(t_on["train_time"]), _ratio(t_on["train_time"], t_off.get("train_time"))])
    if not rows:
        return None
    notes = ["on: quantroll train --true-on-policy-mode (batch-invariant kernels in the engine and the trainer's "
             "forward, model/invariant.py); off: the same precision, correction none, same seeds",
             "with the mode the gap must be exactly 0.0 at every step; TIS / mask ratios are then exactly 1"]
    if moe:
        notes.append("MoE: routing is identical on both sides with the mode (agreement 1.0), so R3 (routing replay) "
                     "is a no-op there")
    return Table("true_on_policy", "True on-policy mode: gap with and without, and its cost",
                 ["precision", "gap step 0 off", "gap step 0 on", "gap mean off", "gap mean on", "tokens/s off",
                  "tokens/s on", "on / off", "train s off", "train s on", "on / off"], rows,
                 _legend("rollout / train / quantize / load", "tokens/s"), notes)


def routing_table(summary: dict) -> Table | None:
    rows = [[g["label"], g["correction"], layer, cell(g["routing"]["step0"][layer]), cell(g["routing"]["mean"][layer])]
            for g in summary["groups"] if g["routing"] for layer in map(str, g["routing"]["layers"])]
    if not rows:
        return None
    return Table("routing", "Routing agreement (MoE)", ["group", "correction", "layer", "step 0", "mean over steps"],
                 rows, _legend("routing agreement"))


MEMORY_COLUMNS = (("engine_weight_gib", "engine weights GiB"), ("trainer_weight_gib", "trainer weights GiB"),
                  ("trainer_optimizer_gib", "trainer optimizer GiB"), ("peak_memory_gib", "peak memory GiB"),
                  ("kv_cache_capacity_tokens", "KV capacity tokens"))


def memory_table(summary: dict) -> Table | None:
    cols = [(k, h) for k, h in MEMORY_COLUMNS if any(g["memory"].get(k, {}).get("n") for g in summary["groups"])]
    if not cols:
        return None
    rows = [[g["label"], g["correction"]] + [cell(g["memory"].get(k)) for k, _ in cols] for g in summary["groups"]]
    return Table("memory", "Memory (GiB, weights as stored)", ["group", "correction"] + [h for _, h in cols], rows,
                 _legend("engine weights", "trainer weights", "trainer optimizer", "peak memory", "KV capacity"))


def checkpoints_table(summary: dict) -> Table | None:
    """What each checkpoint of the study kept in high precision, and by which rule (inventory.py)."""
    rows = []
    for c in summary.get("checkpoints", []):
        kept = "; ".join(f"{k['count']} {k['reason']}: {', '.join(k['names'][:4])}"
                         + (f", ... and {k['count'] - 4} more" if k["count"] > 4 else "") for k in c["kept"])
        rows.append([c["precision"], c["format"] + (f" ({c['scale_rule']})" if c.get("scale_rule") else ""),
                     "none (the BF16 source)" if c["format"] == "bf16" else
                     f"{c['quantized']} of {c['quantized'] + c.get('linears_kept', 0)} linear weights",
                     kept or ("everything" if c["format"] == "bf16" else "nothing"),
                     f"{c['total_bytes'] / 2**30:.4g}"])
    if not rows:
        return None
    rules = sorted({(k["reason"], k["rule"]) for c in summary.get("checkpoints", []) for k in c["kept"]})
    return Table("checkpoints", "Checkpoints: what stayed in high precision, and why",
                 ["checkpoint", "format", "modules quantized", "kept in BF16 (count, rule: names)", "GiB as stored"],
                 rows, rules, ["from `quantroll inspect` on each checkpoint the runs load"])


def length_table(summary: dict) -> Table | None:
    """The gap per response-length bucket, over all steps of each group's runs."""
    metrics = (MAIN_GAP, "train_rollout_kl", "chi2_seq")
    rows = [[g["label"], g["correction"], f"{b}-{2 * int(b) - 1}", str(v["tokens"])] + [cell(v[m]) for m in metrics]
            for g in summary["groups"] for b, v in g.get("gap_by_len", {}).items()]
    if not rows:
        return None
    return Table("by_len", "Gap by response length (all steps)",
                 ["group", "correction", "response len", "tokens"] + [SHORT[m] for m in metrics], rows,
                 _legend("response len", "tokens"),
                 ["per run, token-level metrics are token-weighted and sequence-level ones sequence-weighted over "
                  "steps; then mean ± std over seeds", SEE_ABOVE])


def sweep_table(summary: dict, compact: bool) -> Table | None:
    if not summary["sweep"]:
        return None
    metrics = COMPACT_GAP if compact else summary["gap_metrics"]
    rows = [[s["label"], s["correction"], str(s["response_len"]), str(s["gap_step0"][MAIN_GAP]["n"])]
            + [cell(s["gap_step0"][m]) for m in metrics] for s in summary["sweep"]]
    return Table("sweep", "Gap at step 0 vs response length (sweep)",
                 ["group", "correction", "response len", "n"] + [SHORT.get(m, m) for m in metrics], rows,
                 notes=[SEE_ABOVE])


def _acceptable(a: dict) -> str:
    return {True: "yes", False: "no", None: "not judged"}[a["acceptable"]] + (" (1 seed)" if a["one_seed"] else "")


def recommendation_table(summary: dict) -> Table:
    rec = summary["recommendation"]
    base = next((g for g in summary["groups"] if g["id"] == summary["baseline"]), None)
    rows = []
    if base is not None:
        rows.append(["bf16 (baseline)", "none", cell(base["reward"]["final"]), cell((base["eval"] or {}).get("trainer")),
                     cell(base["gap_mean"][MAIN_GAP]), "baseline", ""])
    rows += [[m["label"], c["correction"], cell(c["final reward"]), cell(c["held-out accuracy"]),
              cell(c["gap over steps"]), _acceptable(c["acceptance"]), "<- use" if m["choice"] == c["correction"] else ""]
             for m in rec["modes"] for c in m["candidates"]]
    notes = [m["text"] for m in rec["modes"]] + [v["text"] for v in rec["verdicts"]] + [rec["rule"],
                                                                                         summary["notes"]["significance"]]
    return Table("recommendation", "Recommendation",
                 ["mode", "correction", "final reward", "held-out acc", "gap over steps", "acceptable vs BF16",
                  "choice"], rows, _legend("final reward", "held-out acc", MAIN_GAP), notes)


def runs_table(summary: dict) -> Table:
    rows = []
    for r in summary["runs"]:
        issues = (["last line truncated"] if r["truncated_last_line"] else []) + \
                 ([f"bad lines {r['bad_lines']}"] if r["bad_lines"] else [])
        rows.append([r["run_id"], str(r["status"]), r["label"], r["correction"], str(r["seed"]),
                     "sweep" if r["sweep"] else "", str(r["response_len"]), str(r["num_steps"]), num(r["gap_step0"]),
                     num(r["reward_mean"]), num(r["wall_time_s"], ".1f"), "; ".join(issues)])
    return Table("runs", "Runs", ["run", "status", "group", "correction", "seed", "sweep", "response len", "steps",
                                  "gap step 0", "reward", "wall s", "notes"], rows)


def failed_table(summary: dict) -> Table | None:
    if not summary["failed"]:
        return None
    rows = [[f["run_id"], f["label"], f["correction"], str(f["seed"]), str(f["error"] or "")] for f in summary["failed"]]
    return Table("failed", "Failed runs", ["run", "group", "correction", "seed", "error"], rows)


def build_tables(summary: dict, compact: bool = False) -> list[Table]:
    """All report tables in reading order (tables without data are left out)."""
    tables = [groups_table(summary), checkpoints_table(summary),
              _gap_table(summary, "gap_step0", "Gap at step 0 (initial weights)", "gap_step0", compact, True),
              _gap_table(summary, "gap_mean", "Gap, mean over steps", "gap_mean", compact, False),
              length_table(summary), sweep_table(summary, compact), reward_table(summary), time_table(summary),
              true_on_policy_table(summary), routing_table(summary), memory_table(summary),
              recommendation_table(summary), failed_table(summary),
              runs_table(summary)]
    return [t for t in tables if t is not None]


# each plot once, after the first of its tables that the report has
PLOTS_AFTER = {"gap_mean": ("gap_vs_step.png",), "by_len": ("gap_vs_response_len.png",),
               "sweep": ("gap_vs_response_len.png",), "reward": ("reward_vs_step.png", "eval_vs_step.png"),
               "time": ("time_breakdown.png",)}


def plots_after(tables: list[Table]) -> dict[str, tuple[str, ...]]:
    """PLOTS_AFTER restricted so that no plot appears twice."""
    seen, out = set(), {}
    for t in tables:
        names = tuple(n for n in PLOTS_AFTER.get(t.key, ()) if n not in seen)
        seen.update(names)
        out[t.key] = names
    return out


def answer(summary: dict) -> list[str]:
    """The report's first lines: per low-precision mode, acceptable vs BF16 or not, and the correction."""
    modes = summary["recommendation"]["modes"]
    if not modes:
        return ["No low-precision mode finished: nothing to recommend."]
    return [m["text"] for m in modes] + [summary["recommendation"]["rule"]]


def preamble(summary: dict) -> list[str]:
    """What a reader must know before the tables: baseline, loss aggregation, emulation, warnings."""
    lines = [f"Baseline: {summary['baseline'] or 'none (no bf16 group finished)'}."]
    aggs = sorted({a for g in summary["groups"] for a in g["loss_agg"]})
    if aggs:
        lines.append(f"Loss aggregation: {', '.join(aggs)}.")
    emulated = sorted({g["label"] for g in summary["groups"] if g["emulated"]})
    if emulated:
        lines.append(f"Emulated on this hardware (numerics exact, times not representative): {', '.join(emulated)}.")
    lines.append(f"Step 0's gap is measured on the initial weights, before any update; {summary['notes']['warmup']}.")
    lines += [f"Warning: {w}" for w in summary["warnings"]]
    return lines

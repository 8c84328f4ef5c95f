"""summary.json -> tables as plain cells, rendered later as Markdown, HTML or terminal text.

Building the cells once keeps the three renderings identical in content; each table
carries a legend that explains every metric it shows in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantroll.compare.perrun import MAIN_GAP

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
    "eval engine / trainer": ("held-out greedy accuracy of the engine's (rollout precision) and the trainer's "
                              "policy at the last eval step"),
    "rollout / train / quantize / load": "seconds per step of generation, training, weight re-quantization and weight loading",
    "tokens/s": "tokens generated per second of rollout",
    "speedup": "bf16 rollout time / this rollout time (tokens/s ratio: this / bf16)",
    "saved / extra sync / net": "rollout seconds saved vs bf16, extra sync seconds vs bf16 per update, saved - extra",
    "break-even len": "response-length limit at which saved = extra sync (linear extrapolation, see the assumption)",
    "routing agreement": "share of tokens whose top-k expert set is the same in trainer and engine (1 = identical), "
                         "from the trainer's own router: what R3 replays away",
    "peak memory": "peak memory in GB, max over steps: GPU memory allocated on CUDA, the process's resident set on CPU",
    "KV capacity": "tokens the engine's KV cache can hold",
    "engine weights": "GB of the engine's weights",
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


def reward_table(summary: dict) -> Table:
    rows = []
    for g in summary["groups"]:
        ev = g["eval"] or {}
        rows.append([g["label"], g["correction"], str(g["reward"]["mean"]["n"]), cell(g["reward"]["mean"]),
                     cell(g["reward"]["final"]), _diff(g["reward_vs_bf16"]), cell(g["accuracy"]["mean"]),
                     f"{cell(ev.get('engine'))} / {cell(ev.get('trainer'))}" if ev else "n/a"])
    return Table("reward", "Reward and accuracy",
                 ["group", "correction", "n", "reward", "final reward", "reward - bf16", "accuracy",
                  "eval engine / trainer"], rows,
                 _legend("reward", "final reward", "reward - bf16", "accuracy", "eval engine / trainer"))


def time_table(summary: dict) -> Table:
    rows = []
    for g in summary["groups"]:
        t, sp = g["time"], g["speed"] or {}
        pays = {True: "yes", False: "no"}.get(sp.get("pays"), "n/a" if g["speed"] else "baseline")
        be = sp.get("break_even_response_len")
        rows.append([g["label"], g["correction"], cell(t["rollout_time"]), cell(t["train_time"]),
                     cell(t["weight_quantize_time"]), cell(t["weight_load_time"]), cell(t["rollout_tokens_per_s"]),
                     f"{num(sp.get('speedup'))}x / {num(sp.get('tokens_per_s_ratio'))}x" if g["speed"] else "1x",
                     f"{num(sp.get('saved_s'))} / {num(sp.get('extra_sync_s'))} / {num(sp.get('net_s'))}",
                     pays, num(be, ".0f") if be is not None else (sp.get("break_even_note") or "n/a")])
    notes = [summary["notes"]["warmup"], summary["notes"]["break_even"]]
    return Table("time", "Time per step, speedup and break-even",
                 ["group", "correction", "rollout s", "train s", "quantize s", "load s", "tokens/s", "speedup",
                  "saved / extra sync / net s", "pays", "break-even len"], rows,
                 _legend("rollout / train / quantize / load", "tokens/s", "speedup", "saved / extra sync / net",
                         "break-even len"), notes)


def routing_table(summary: dict) -> Table | None:
    rows = [[g["label"], g["correction"], layer, cell(g["routing"]["step0"][layer]), cell(g["routing"]["mean"][layer])]
            for g in summary["groups"] if g["routing"] for layer in map(str, g["routing"]["layers"])]
    if not rows:
        return None
    return Table("routing", "Routing agreement (MoE)", ["group", "correction", "layer", "step 0", "mean over steps"],
                 rows, _legend("routing agreement"))


def memory_table(summary: dict) -> Table | None:
    keys = ("peak_memory_gb", "kv_cache_capacity_tokens", "engine_weight_gb")
    if not any(g["memory"][k]["n"] for g in summary["groups"] for k in keys):
        return None
    rows = [[g["label"], g["correction"]] + [cell(g["memory"][k]) for k in keys] for g in summary["groups"]]
    return Table("memory", "Memory", ["group", "correction", "peak memory GB", "KV capacity tokens", "engine weights GB"],
                 rows, _legend("peak memory", "KV capacity", "engine weights"))


def sweep_table(summary: dict, compact: bool) -> Table | None:
    if not summary["sweep"]:
        return None
    metrics = COMPACT_GAP if compact else summary["gap_metrics"]
    rows = [[s["label"], s["correction"], str(s["response_len"]), str(s["gap_step0"][MAIN_GAP]["n"])]
            + [cell(s["gap_step0"][m]) for m in metrics] for s in summary["sweep"]]
    return Table("sweep", "Gap at step 0 vs response length (sweep)",
                 ["group", "correction", "response len", "n"] + [SHORT.get(m, m) for m in metrics], rows,
                 notes=[SEE_ABOVE])


def recommendation_table(summary: dict) -> Table:
    rec = summary["recommendation"]
    rows = [[m["label"], c["correction"], cell(c["gap"]), _diff(c["gap_vs_bf16"]), cell(c["reward"]),
             _diff(c["reward_vs_bf16"]), "<- use" if m["choice"] == c["correction"] else ""]
            for m in rec["modes"] for c in m["candidates"]]
    notes = [m["text"] for m in rec["modes"]] + [v["text"] for v in rec["verdicts"]] + [summary["notes"]["significance"]]
    return Table("recommendation", "Recommendation",
                 ["mode", "correction", "gap over steps", "gap - bf16", "reward over steps", "reward - bf16", "choice"],
                 rows, _legend(MAIN_GAP, "reward"), notes)


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
    tables = [groups_table(summary),
              _gap_table(summary, "gap_step0", "Gap at step 0 (initial weights)", "gap_step0", compact, True),
              _gap_table(summary, "gap_mean", "Gap, mean over steps", "gap_mean", compact, False),
              sweep_table(summary, compact), reward_table(summary), time_table(summary), routing_table(summary),
              memory_table(summary), recommendation_table(summary), failed_table(summary), runs_table(summary)]
    return [t for t in tables if t is not None]


PLOTS_AFTER = {"gap_mean": ("gap_vs_step.png",), "sweep": ("gap_vs_response_len.png",),
               "reward": ("reward_vs_step.png",), "time": ("time_breakdown.png",)}


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

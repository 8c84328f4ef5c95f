"""summary.json -> tables as plain cells, rendered later as Markdown, HTML or terminal text.

Building the cells once keeps the three renderings identical in content; each table
carries a legend that explains every metric it shows in one line.
"""

from __future__ import annotations

from quantroll.compare.answer import recommendation_table
from quantroll.compare.cells import (CHI2_NEGATIVE, COMPACT_GAP, SEE_ABOVE, SHORT, Table, cell, chi2_negative, diff_cell,
                                     k_header, legend, num)
from quantroll.compare.perrun import MAIN_GAP
from quantroll.compare.speed import update_over_copy


def _gap_table(summary: dict, key: str, title: str, field_name: str, compact: bool, explain: bool) -> Table:
    """``explain``: the first gap table carries the metric legend, the later ones point back to it."""
    metrics = COMPACT_GAP if compact else summary["gap_metrics"]
    rows = [[g["label"], g["correction"], str(g["gap_step0"][MAIN_GAP]["n"]),
             cell((g.get("entropy") or {}).get(field_name))]  # (a summary.json from before the column: n/a)
            + [cell(g[field_name][m]) for m in metrics] for g in summary["groups"]]
    notes = ([] if explain else [SEE_ABOVE]) + ([CHI2_NEGATIVE] if chi2_negative(summary, field_name) else [])
    return Table(key, title, ["group", "correction", "n", "entropy"] + [SHORT.get(m, m) for m in metrics], rows,
                 legend("n", "entropy", *metrics) if explain else [], notes)


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
                     cell(g["reward"]["mean"]), cell(g["reward"]["last_steps"]), diff_cell(g["reward_vs_bf16"]),
                     _eval_cell(ev, True), _eval_cell(ev, False)])
    return Table("reward", "Reward and held-out accuracy",
                 ["group", "correction", "n", "reward step 0", "reward", k_header(summary), "reward - bf16",
                  "eval engine / trainer, first", "eval engine / trainer, last"], rows,
                 legend("reward step 0", "reward", "reward, last k steps", "reward - bf16", "eval engine / trainer"))


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
                 legend("rollout / train / quantize / load", "update / copy", "tokens/s", "speedup",
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
                 legend("rollout / train / quantize / load", "tokens/s"), notes)


def routing_table(summary: dict) -> Table | None:
    rows = [[g["label"], g["correction"], layer, cell(g["routing"]["step0"][layer]), cell(g["routing"]["mean"][layer])]
            for g in summary["groups"] if g["routing"] for layer in map(str, g["routing"]["layers"])]
    if not rows:
        return None
    return Table("routing", "Routing agreement (MoE)", ["group", "correction", "layer", "step 0", "mean over steps"],
                 rows, legend("routing agreement"))


MEMORY_COLUMNS = (("engine_weight_gib", "engine weights GiB"), ("trainer_weight_gib", "trainer weights GiB"),
                  ("trainer_optimizer_gib", "trainer optimizer GiB"), ("peak_memory_gib", "peak memory GiB"),
                  ("kv_cache_capacity_tokens", "KV capacity tokens"))


def memory_table(summary: dict) -> Table | None:
    cols = [(k, h) for k, h in MEMORY_COLUMNS if any(g["memory"].get(k, {}).get("n") for g in summary["groups"])]
    if not cols:
        return None
    rows = [[g["label"], g["correction"]] + [cell(g["memory"].get(k)) for k, _ in cols] for g in summary["groups"]]
    return Table("memory", "Memory (GiB, weights as stored)", ["group", "correction"] + [h for _, h in cols], rows,
                 legend("engine weights", "trainer weights", "trainer optimizer", "peak memory", "KV capacity"))


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
                 legend("response len", "tokens"),
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

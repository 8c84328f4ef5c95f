"""The attribution result as text (terminal and report.md), JSON and the plot.

Every number says what it is: exact ablations apart from cheap estimates, means ± std
over seeds, the gap metric named once at the top.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantroll.attribution.units import KIND_NAMES

TOP_CELLS = 8


def _s(st: dict | None) -> str:
    if not st or st.get("mean") is None:
        return "n/a"
    return f"{st['mean']:.4g}" + (f" ± {st['std']:.2g}" if st.get("std") is not None else "")


def _mb(n: int) -> str:
    return f"{n / 1e6:.3g} MB"


def _table(rows: list[dict], first: str) -> list[str]:
    out = [f"| {first} | only this unit low precision | saved by keeping it BF16 | gap with it BF16 |",
           "| --- | --- | --- | --- |"]
    out += [f"| {r['unit']} | {_s(r['only'])} | {_s(r['saved'])} | {_s(r['without'])} |" for r in rows]
    return out


def _ranked(result: dict, level: str) -> list[dict]:
    rows = {json.dumps(r["key"]): r for r in result["contributions"] if r["level"] == level}
    key = {"layer": "rank_layers", "kind": "rank_kinds", "cell": "rank_cells"}[level]
    return [rows[json.dumps(k)] for k in result[key]]


def format_report(result: dict) -> str:
    cfg = result["config"]
    lines = [f"# Where the {result['precision_label']} rollout gap comes from", "",
             f"Model: {result['model']}. Gap: mean |logp_train - logp_rollout| over response tokens (the compare "
             f"study's main metric), on {cfg['prompts']} prompts x {cfg['samples']} samples per seed "
             f"(seeds {', '.join(map(str, cfg['seeds']))}; {', '.join(map(str, result['tokens_per_seed']))} tokens), "
             "responses sampled by the engine on the full conversion and scored teacher-forced. Numbers are "
             "mean ± std over seeds.", "",
             f"- gap with every linear in {result['precision']}: {_s(result['gap_full'])} (against the engine's own "
             f"logprobs: {_s(result['gap_engine'])})"]
    if "contributions" in result:
        lines += ["", "## Exact ablations (ranked by the gap saved)", "",
                  "only: the gap with that unit alone in low precision; saved: the full gap minus the gap with "
                  "that unit kept BF16 (everything else low precision). Interactions between layers make them "
                  "differ.", ""]
        lines += _table(_ranked(result, "layer"), "layer") + [""]
        lines += _table(_ranked(result, "kind"), "module kind") + [""]
        lines += _table(_ranked(result, "cell")[:TOP_CELLS], f"cell (top {TOP_CELLS})")
    cheap = result["cheap"]
    lines += ["", "## Cheap estimates (one forward per precision; no ablation)", "",
              "hidden divergence: ||h_lp - h_bf16|| / ||h_bf16|| after the layer, every linear low precision "
              "(it accumulates over layers); local error: the layer's linears in low precision fed the BF16 "
              "model's own inputs (relative output error, every position of the padded batch)"
              + ("; routing flips: share of tokens whose top-k expert set differs from BF16's" if result["moe"]
                 else "") + ".", "",
              "| layer | hidden divergence | local error |" + (" routing flips |" if result["moe"] else ""),
              "| --- | --- | --- |" + (" --- |" if result["moe"] else "")]
    for i, d in enumerate(cheap["hidden_divergence"]):
        row = f"| {i} | {d:.3g} | {cheap['layer_local_error'].get(str(i), float('nan')):.3g} |"
        if result["moe"]:
            row += f" {cheap['routing_flips'].get(str(i), float('nan')):.3g} |"
        lines.append(row)
    lines += ["", f"Ranking of layers by local error: {', '.join(map(str, result['cheap_rank_layers']))}"
              + (f"; by the exact ablations: {', '.join(map(str, result['rank_layers']))}" if "rank_layers" in result
                 else "") + "."]
    p = result.get("proposal")
    if p and p.get("unreachable"):
        lines += ["", "## Proposal: BF16 exceptions", "", f"None: {p['unreachable']}."]
    elif p:
        lines += ["", "## Proposal: BF16 exceptions", "",
                  f"Greedy on measured gaps to {p['target']:.4g} ({p['target_rule']}): keep "
                  f"{', '.join(p['names']) or 'nothing'} in BF16.", "",
                  f"- gap with them kept: {_s(p['gap'])} ({'reached' if p['reached'] else 'NOT reached'}; "
                  f"full {_s(result['gap_full'])})",
                  f"- cost: {_mb(p['bf16_bytes'])} of weights stay BF16, {_mb(p['extra_bytes'])} more than in "
                  f"{result['precision']} (+{100 * p['extra_share']:.1f}% of the linear weight bytes a decode step "
                  "reads)",
                  f"- flags (convert, train --rollout-precision, compare): `{p['flags_text'] or '(none)'}`"]
    v = result.get("verification")
    if v:
        verdict = ("not judged (one seed)" if v["significant"] is None else
                   "lowers the gap by more than 2x the spread" if v["significant"] else
                   "NOT beyond 2x the spread")
        lines += [f"- verified through convert + engine + trainer on fresh seeds {', '.join(map(str, v['seeds']))}: "
                  f"{_s(v['full'])} -> {_s(v['kept'])}, reduction {v['reduction']:.4g}, spread "
                  f"{'n/a' if v['spread'] is None else format(v['spread'], '.2g')}: {verdict}"
                  + (f" (paired spread of the per-seed differences {v['paired_spread']:.2g})"
                     if v.get("paired_spread") is not None else "")]
    if "contributions" in result and result["moe"]:
        router = next((r for r in result["contributions"] if r["key"] == "router"), None)
        if router:
            lines += ["", f"Router ({KIND_NAMES['router']}): always BF16 in the checkpoint; its expert choices flip "
                      f"under low-precision inputs and carry {_s(router['saved'])} of the gap (what routing replay, "
                      "r3, removes; no BF16 exception can)."]
    return "\n".join(lines) + "\n"


def write_outputs(result: dict, out_dir: Path) -> dict[str, Path]:
    """attribution.json, report.md and plots/gap_contribution.png into ``out_dir`` (exists)."""
    paths = {"json": out_dir / "attribution.json", "report": out_dir / "report.md"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n")
    text = format_report(result)
    if "contributions" in result:
        from quantroll.attribution.plot import plot_contributions

        paths["plot"] = plot_contributions(result, out_dir / "plots" / "gap_contribution.png")
        text += "\n![gap contribution per layer and module kind](plots/gap_contribution.png)\n"
    paths["report"].write_text(text)
    return paths

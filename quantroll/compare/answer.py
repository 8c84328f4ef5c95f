"""The answer a study gives, for the first lines of every report: per mode, acceptable vs
BF16 or not and whether a correction is needed (recommend.py decides, this module words
it); which modes were not run and how to add them; the held-out warnings that qualify the
answer; and the recommendation table that lays out the evidence.
"""

from __future__ import annotations

from quantroll.compare.cells import Table, cell, k_header, legend
from quantroll.compare.perrun import MAIN_GAP
from quantroll.compare.recommend import GAP, HELD_OUT, REWARD, criterion_stats
from quantroll.formats import display_name, format_class, unified_modes


def _acceptable(a: dict) -> str:
    return {True: "yes", False: "no", None: "not judged"}[a["acceptable"]] + (" (1 seed)" if a["one_seed"] else "")


def _choice(mode: dict, cand: dict) -> str:
    """The choice column: the mode's chosen correction is marked for use unless the mode itself failed
    against BF16, where it is only the mode's best run (a pointer to use it would contradict the answer)."""
    if mode["choice"] != cand["correction"]:
        return ""
    return "its best; mode not acceptable" if mode["acceptable"] is False else "<- use"


def recommendation_table(summary: dict) -> Table:
    rec = summary["recommendation"]
    base = next((g for g in summary["groups"] if g["id"] == summary["baseline"]), None)
    rows = []
    if base is not None:
        rows.append(["bf16 (baseline)", "none", cell(criterion_stats(base, REWARD)), cell(criterion_stats(base, HELD_OUT)),
                     cell(base["gap_mean"][MAIN_GAP]), "baseline", ""])
    rows += [[m["label"], c["correction"], cell(c[REWARD]), cell(c[HELD_OUT]), cell(c[GAP]),
              _acceptable(c["acceptance"]), _choice(m, c)] for m in rec["modes"] for c in m["candidates"]]
    notes = [m["text"] for m in rec["modes"]] + [v["text"] for v in rec["verdicts"]] + [rec["rule"],
                                                                                         summary["notes"]["significance"]]
    return Table("recommendation", "Recommendation",
                 ["mode", "correction", k_header(summary), "held-out acc", "|logp diff| over steps (not chosen on)",
                  "acceptable vs BF16", "choice"], rows, legend("reward, last k steps", "held-out acc", MAIN_GAP), notes)


def more_modes(summary: dict) -> str | None:
    """How to add the unified modes the study did not run (3 and 4 after the default's 1 and 2)."""
    run = {g["precision"] for g in summary["groups"] if g["unified"]}
    missing = {m: p for m, p in unified_modes().items() if p not in run}
    if not missing:
        return None
    precisions = list(dict.fromkeys(["bf16", *(g["precision"] for g in summary["groups"]), *unified_modes().values()]))
    modes = sorted({"1", *unified_modes()})
    names = ", ".join(f"{m} ({display_name(p)})" for m, p in sorted(missing.items()))
    emulated = [display_name(p) for m, p in sorted(missing.items()) if format_class(p).emulated_only]
    note = (f" ({' and '.join(emulated)}: no native arithmetic on Hopper or CPUs, so quantroll emulates "
            f"{'them' if len(emulated) > 1 else 'it'} exactly and labels those runs (emulated))" if emulated else "")
    return (f"Not run: mode{'s' if len(missing) > 1 else ''} {names}. Add with: quantroll compare --precisions "
            f"{','.join(precisions)} --modes {','.join(modes)}{note}.")


def answer(summary: dict) -> list[str]:
    """The report's first lines: per low-precision mode, acceptable vs BF16 or not, and the correction;
    the modes not run and how to add them; what qualifies the answer (held-out warnings); the rule."""
    modes = summary["recommendation"]["modes"]
    lines = [m["text"] for m in modes] or ["No low-precision mode finished: nothing to recommend."]
    lines += [x for x in [more_modes(summary)] if x]
    lines += [f"Warning: {w}" for w in summary.get("heldout_warnings", [])]
    return lines + ([summary["recommendation"]["rule"]] if modes else [])


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

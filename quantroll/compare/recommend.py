"""Per low-precision mode: is it acceptable against BF16, and which correction to use.

A study that ends in "no significant difference" has not answered its user. So the rule
below always chooses, and says on what evidence (RULE is printed in every report):

1. The correction. Criteria in order: final reward, held-out accuracy of the trainer's
   policy, mean gap over steps. Each criterion keeps the corrections that are not
   farther from BF16 than the closest one beyond their seed spread
   (sqrt(std_a^2 + std_b^2), ddof=1); a correction without data on a criterion, or
   with one seed, cannot be shown farther and stays. Of those left, the cheapest, in the
   order none < tis < mask < r3. So when no difference between corrections is
   significant the choice is none, and a correction that is significantly closer to
   BF16 on the first criterion that separates them wins.
2. Acceptable vs BF16 (judged on the chosen correction): its final reward and its
   held-out accuracy are each within max(2 x seed spread, 0.02) of BF16's. With one
   seed the spread is unknown: the point estimate is held against 0.02 alone, and the
   line says so.

With no BF16 baseline, "closest to BF16" becomes the highest reward and accuracy and
the smallest gap, and acceptability is not judged. The evidence line says what the
corrections did (how much TIS clipped and the range its ratios stayed in; what mask
mode dropped; how often routing agreed without replay), so "TIS is unnecessary here"
reads apart from "TIS does not work".
"""

from __future__ import annotations

import math

from quantroll.compare.labels import CORRECTION_ORDER
from quantroll.compare.perrun import MAIN_GAP
from quantroll.compare.speed import verdict

FLOOR = 0.02  # absolute tolerance of "acceptable vs BF16" (rewards and accuracies are in [0, 1])
FACTOR = 2.0  # ... or this many seed spreads, whichever is larger
RULE = ("Rule: per mode, the correction is chosen first: final reward, then held-out accuracy (trainer's policy), "
        "then the mean gap over steps each keep the corrections not farther from BF16 than the closest one beyond "
        "the seed spread sqrt(std_a^2 + std_b^2); of those left, the cheapest (none < tis < mask < r3), so with no "
        "significant difference between corrections it is none. The mode is acceptable vs BF16 when that "
        f"correction's final reward and held-out accuracy are each within max({FACTOR:g} x seed spread, {FLOOR:g}) "
        "of BF16's; with one seed the spread is unknown and the point estimate is held against "
        f"{FLOOR:g} alone.")
CRITERIA = ("final reward", "held-out accuracy", "gap over steps")


def criterion_stats(group: dict, name: str) -> dict | None:
    """The stats a criterion reads from a group (None where the group has no such data)."""
    if name == "final reward":
        return group["reward"]["final"]
    if name == "held-out accuracy":
        return (group.get("eval") or {}).get("trainer")
    return group["gap_mean"][MAIN_GAP]


def _mean(s: dict | None) -> float | None:
    return None if not s else s.get("mean")


def _cost(correction: str) -> int:
    return CORRECTION_ORDER.index(correction) if correction in CORRECTION_ORDER else len(CORRECTION_ORDER)


def distance(value: dict | None, base: dict | None, name: str) -> float | None:
    """How far from BF16 (smaller is better); without a baseline, from the ideal instead."""
    v = _mean(value)
    if v is None:
        return None
    if base is not None and _mean(base) is not None:
        return abs(v - base["mean"])
    return v if name == "gap over steps" else -v


def _spread(a: dict, b: dict) -> float | None:
    if a.get("std") is None or b.get("std") is None:
        return None
    return math.hypot(a["std"], b["std"])


def choose(cands: dict[str, dict], base: dict | None) -> dict:
    """The correction for one mode: ``cands`` maps correction -> group (see RULE)."""
    kept = sorted(cands, key=_cost)
    steps, unknown = [], False
    for name in CRITERIA:
        ref = criterion_stats(base, name) if base else None
        scored = {c: (distance(criterion_stats(cands[c], name), ref, name), criterion_stats(cands[c], name))
                  for c in kept}
        scored = {c: v for c, v in scored.items() if v[0] is not None}
        if len(scored) < 2:
            continue
        best = min(scored, key=lambda c: (scored[c][0], _cost(c)))
        dropped = []
        for c, (d, s) in scored.items():
            if c == best:
                continue
            spread = _spread(s, scored[best][1])
            if spread is None:
                unknown = True
            elif d - scored[best][0] > spread:
                dropped.append({"correction": c, "mean": s["mean"], "best": best, "best_mean": scored[best][1]["mean"],
                                "spread": spread})
        steps.append({"criterion": name, "best": best, "baseline": _mean(ref), "dropped": dropped})
        kept = [c for c in kept if c not in {d["correction"] for d in dropped}]
    return {"choice": kept[0], "kept": kept, "steps": steps, "one_seed": unknown}


def _why(chosen: dict, corrections: list[str]) -> str:
    if len(corrections) == 1:
        return f"only {corrections[0]} was run"
    dropped = [(s, d) for s in chosen["steps"] for d in s["dropped"]]
    if not dropped:
        if chosen["one_seed"]:
            return ("1 seed: spread unknown, so no difference between corrections can be shown significant; "
                    "the cheapest")
        return "no significant difference between corrections in final reward, held-out accuracy or gap, so the cheapest"
    parts = []
    for s, d in dropped:
        base = f", BF16 {s['baseline']:.3g}" if s["baseline"] is not None else ""
        parts.append(f"{d['best']} is closer to BF16 than {d['correction']} in {s['criterion']} beyond the seed "
                     f"spread between corrections ({d['best_mean']:.3g} vs {d['mean']:.3g}{base}; spread "
                     f"{d['spread']:.3g})")
    rest = chosen["kept"]
    tail = f"; of {', '.join(rest)} (no significant difference left) the cheapest" if len(rest) > 1 else ""
    return "; ".join(parts) + tail


def acceptance(group: dict, base: dict | None) -> dict:
    """Is ``group`` within tolerance of BF16 in final reward and held-out accuracy?"""
    if base is None:
        return {"acceptable": None, "checks": [], "one_seed": False,
                "text": "not judged vs BF16: no BF16 baseline finished"}
    checks, missing, one_seed = [], [], False
    for name in CRITERIA[:2]:
        a, b = criterion_stats(group, name), criterion_stats(base, name)
        if _mean(a) is None or _mean(b) is None:
            missing.append(name)
            continue
        spread = _spread(a, b)
        one_seed |= spread is None
        tol = FLOOR if spread is None else max(FACTOR * spread, FLOOR)
        diff = a["mean"] - b["mean"]
        checks.append({"criterion": name, "value": a["mean"], "bf16": b["mean"], "diff": diff, "tolerance": tol,
                       "spread": spread, "within": abs(diff) <= tol})
    if not checks:
        return {"acceptable": None, "checks": [], "one_seed": False,
                "text": f"not judged vs BF16: no {' or '.join(missing)} measured"}
    ok = all(c["within"] for c in checks)
    detail = "; ".join(f"{c['criterion']} {c['value']:.3g} vs BF16 {c['bf16']:.3g}: {c['diff']:+.3g}, "
                       f"{'within' if c['within'] else 'beyond'} ±{c['tolerance']:.3g}" for c in checks)
    head = "acceptable vs BF16" if ok else "NOT acceptable vs BF16"
    if one_seed:
        head += f" by the point estimate (1 seed: spread unknown, tolerance {FLOOR:g})"
    if missing:
        detail += f"; {' and '.join(missing)} not measured"
    return {"acceptable": ok, "checks": checks, "one_seed": one_seed, "text": f"{head} ({detail})"}


def _percent(share: float) -> str:
    """A share as a percentage that never rounds a non-zero share to 0.0%."""
    return "0.0%" if share == 0 else f"{100 * share:.2g}%" if share < 0.001 else f"{share:.1%}"


def evidence(cands: dict[str, dict]) -> list[str]:
    """What each correction did, from its runs' own metrics."""
    out = []
    for corr, g in cands.items():
        means, ext = g.get("metrics_mean", {}), g.get("extremes", {})
        lo, hi = ext.get("tis_ratio_min"), ext.get("tis_ratio_max")
        span = f"[{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None else None
        if corr == "tis" and _mean(means.get("tis_clipfrac")) is not None:
            clip = means["tis_clipfrac"]["mean"]
            if span and clip == 0:
                out.append(f"TIS clipped 0.0% of tokens: the ratios never left {span}")
            else:
                out.append(f"TIS clipped {_percent(clip)} of tokens" + (f"; the ratios ranged over {span}" if span else ""))
        if corr == "mask" and _mean(means.get("masked_fraction")) is not None:
            out.append(f"mask dropped {_percent(means['masked_fraction']['mean'])} of tokens"
                       + (f"; the ratios ranged over {span}" if span else ""))
    plain = cands.get("none")
    if "r3" in cands and plain is not None and plain.get("routing"):
        shares = [_mean(s) for s in plain["routing"]["mean"].values() if _mean(s) is not None]
        if shares:
            out.append(f"without replay, {sum(shares) / len(shares):.1%} of tokens kept the same top-k experts in "
                       "trainer and engine (mean over MoE layers)")
    return out


def _mode_entry(mode: str, groups: list[dict], base: dict | None) -> dict:
    cands = {g["correction"]: g for g in groups}
    chosen = choose(cands, base)
    accept = acceptance(cands[chosen["choice"]], base)
    label = groups[0]["label"] if all(g["label"] == groups[0]["label"] for g in groups) else mode
    why = _why(chosen, sorted(cands, key=_cost))
    proof = evidence(cands)
    text = f"{label}: {accept['text']}. Correction: {chosen['choice']}: {why}"
    if proof:
        text += ". " + "; ".join(proof)
    candidates = [{"correction": c, "group": g["id"], **{name: criterion_stats(g, name) for name in CRITERIA},
                   "acceptance": acceptance(g, base)} for c, g in sorted(cands.items(), key=lambda kv: _cost(kv[0]))]
    return {"mode": mode, "label": label, "emulated": any(g["emulated"] for g in groups), "candidates": candidates,
            "choice": chosen["choice"], "kept": chosen["kept"], "steps": chosen["steps"],
            "one_seed": chosen["one_seed"] or accept["one_seed"], "acceptable": accept["acceptable"],
            "acceptance": accept, "why": why, "evidence": proof, "text": text + "."}


def recommend(groups: list[dict], base: dict | None) -> dict:
    modes: dict[str, list[dict]] = {}
    for g in groups:
        if not g.get("baseline", g["precision"] == "bf16") and not g.get("true_on_policy"):  # its own table
            modes.setdefault(g["mode"], []).append(g)
    entries = [_mode_entry(m, gs, base) for m, gs in modes.items()]
    verdicts = []
    for m, gs in modes.items():
        choice = next(e["choice"] for e in entries if e["mode"] == m)
        g = next((x for x in gs if x["correction"] == choice), gs[0])
        verdicts.append({"mode": m, "group": g["id"], "pays": (g.get("speed") or {}).get("pays"), "text": verdict(g)})
    return {"baseline": base["id"] if base else None, "rule": RULE, "modes": entries, "verdicts": verdicts}

"""Per low-precision mode: is it acceptable against BF16, and is a correction needed.

A correction costs compute and changes the gradient, so the study recommends one only
when the runs show it matters (RULE is printed in every report):

1. The correction. The reference is the cheapest correction run (none, normally). A
   costlier correction is chosen over it only when, on its reward over the last k steps
   (mean over those steps, per run; k stated) or on its last held-out accuracy (the
   trainer's policy), it is closer to BF16's than the reference by more than both the
   seed spread sqrt(std_c^2 + std_ref^2) (ddof=1) and MARGIN (25%) of the reference's
   own difference from BF16 -- and not farther from BF16 than the reference on the
   other criterion by as much. Of the corrections that pass, the cheapest
   (none < tis < mask < r3). With one seed there is no spread, so no correction can
   pass. The train/rollout gap is reported beside, never chosen on: a correction
   exists to fix the outcome, and one that only narrows the gap changes nothing the
   user trains for. Otherwise the answer is "no correction needed: none is
   distinguishable", with the numbers that say so.
2. Acceptable vs BF16 (judged on the chosen correction): its reward over the last k
   steps and its held-out accuracy are each within max(2 x seed spread, 0.02) of
   BF16's. Where one side has a single seed and the other several, the single run's
   spread is taken to equal the other side's (seed spread sqrt(2) x std): a tolerance
   narrower than BF16's own seed-to-seed variation would fail a BF16 rerun. With one
   seed on both sides the spread is unknown: the point estimate is held against 0.02
   alone. The line says which basis it used.

The line also says how many seeds the answer rests on, and what the corrections did
(how much TIS clipped and the range its ratios stayed in; what mask mode dropped; how
often routing agreed without replay), so "TIS is unnecessary here" reads apart from
"TIS does not work".
"""

from __future__ import annotations

import math

from quantroll.compare.labels import CORRECTION_ORDER
from quantroll.compare.matrix import CORRECTION_ARGS, LEVELED
from quantroll.compare.perrun import MAIN_GAP
from quantroll.compare.speed import verdict

FLOOR = 0.02  # absolute tolerance of "acceptable vs BF16" (rewards and accuracies are in [0, 1])
FACTOR = 2.0  # ... or this many seed spreads, whichever is larger
MARGIN = 0.25  # a correction must close more than this share of the FP8-BF16 difference to be chosen
REWARD, HELD_OUT, GAP = "reward over the last k steps", "held-out accuracy", "gap over steps"
CRITERIA = (REWARD, HELD_OUT)  # what a correction is chosen on
REPORTED = CRITERIA + (GAP,)  # what each candidate shows
RULE = ("Rule: per mode, the reference is the cheapest correction run (none). A correction is chosen over it only "
        "when its reward over the last k steps (mean of those steps per run) or its last held-out accuracy "
        "(trainer's policy) is closer to BF16's than the reference's by more than both the seed spread "
        f"sqrt(std_a^2 + std_b^2) and {MARGIN:.0%} of the reference's difference from BF16, and it is not farther "
        "from BF16 by as much on the other; of those that pass, the cheapest (none < tis < mask < r3). The gap is "
        "reported, never chosen on. With one seed no correction can pass. The mode is acceptable vs BF16 when the "
        "chosen correction's reward over the last k steps and held-out accuracy are each within "
        f"max({FACTOR:g} x seed spread, {FLOOR:g}) of BF16's; a group of one seed against several takes the other "
        f"side's spread as its own (seed spread sqrt(2) x std); with one seed on both sides the point estimate is "
        f"held against {FLOOR:g} alone.")


def criterion_stats(group: dict, name: str) -> dict | None:
    """The stats a criterion reads from a group (None where the group has no such data)."""
    if name == REWARD:
        return group["reward"]["last_steps"]
    if name == HELD_OUT:
        return (group.get("eval") or {}).get("trainer")
    return group["gap_mean"][MAIN_GAP]


def last_k(group: dict) -> int | None:
    """k of the group's "reward over the last k steps" (None where its runs used different k)."""
    return group["reward"].get("last_k")


def criterion_name(name: str, k: int | None) -> str:
    return name.replace("k steps", f"{k} steps") if name == REWARD and k is not None else name


def _mean(s: dict | None) -> float | None:
    return None if not s else s.get("mean")


def _cost(correction: str) -> int:
    return CORRECTION_ORDER.index(correction) if correction in CORRECTION_ORDER else len(CORRECTION_ORDER)


def _spread(a: dict, b: dict) -> float | None:
    if a.get("std") is None or b.get("std") is None:
        return None
    return math.hypot(a["std"], b["std"])


def acceptance_spread(group: dict, base: dict) -> tuple[float | None, str | None]:
    """The seed spread of group - base for acceptance, and whose std stood in for both where one
    side has a single seed and the other several (equal spreads assumed: sqrt(2) x the known std);
    None for a measured spread."""
    spread = _spread(group, base)
    if spread is not None:
        return spread, None
    if base.get("std") is not None:
        return math.sqrt(2.0) * base["std"], "BF16's"
    if group.get("std") is not None:
        return math.sqrt(2.0) * group["std"], "this mode's"
    return None, None


def compare_to_reference(cand: dict, ref: dict, base: dict, name: str) -> dict | None:
    """How much closer to BF16 ``cand`` is than ``ref`` on one criterion, and whether that counts."""
    c, r, b = criterion_stats(cand, name), criterion_stats(ref, name), criterion_stats(base, name)
    if _mean(c) is None or _mean(r) is None or _mean(b) is None:
        return None
    ref_diff = abs(r["mean"] - b["mean"])  # the FP8-BF16 difference a correction would close
    gain = ref_diff - abs(c["mean"] - b["mean"])  # > 0: the candidate is closer to BF16
    spread = _spread(c, r)
    need = None if spread is None else max(spread, MARGIN * ref_diff)
    return {"criterion": name, "value": c["mean"], "reference": r["mean"], "bf16": b["mean"], "gain": gain,
            "spread": spread, "margin": MARGIN * ref_diff, "need": need,
            "closer": need is not None and gain > need, "farther": need is not None and -gain > need}


def choose(cands: dict[str, dict], base: dict | None) -> dict:
    """The correction for one mode: ``cands`` maps correction -> group (see RULE)."""
    order = sorted(cands, key=_cost)
    reference = order[0]
    if base is None:
        return {"choice": reference, "reference": reference, "tests": {}, "passed": [], "no_baseline": True}
    tests = {c: [t for name in CRITERIA if (t := compare_to_reference(cands[c], cands[reference], base, name))]
             for c in order[1:]}
    passed = [c for c in order[1:] if any(t["closer"] for t in tests[c]) and not any(t["farther"] for t in tests[c])]
    return {"choice": passed[0] if passed else reference, "reference": reference, "tests": tests, "passed": passed,
            "no_baseline": False}


def seeds_line(cands: dict[str, dict], base: dict | None) -> str:
    """How many seeds the answer rests on (the fewest any group of the mode, BF16 included, finished)."""
    counts = sorted({g["n_runs"] for g in [*cands.values(), *([base] if base else [])]})
    text = f"{counts[0]} seed{'s' if counts[0] != 1 else ''}" if len(counts) == 1 else \
        f"{counts[0]}-{counts[-1]} seeds"
    return f"rests on {text} per group" + (" (no seed spread: nothing can be shown distinguishable)"
                                           if counts[0] < 2 else "")


def _test_text(t: dict, ref: str, k: int | None) -> str:
    need = ("no seed spread (1 seed)" if t["need"] is None else
            f"needs > {t['need']:.3g} = max(seed spread {t['spread']:.3g}, {MARGIN:.0%} of the difference "
            f"{t['margin']:.3g})")
    by = f"closer by {t['gain']:.3g}" if t["gain"] >= 0 else f"farther by {-t['gain']:.3g}"
    return (f"{criterion_name(t['criterion'], k)} {t['value']:.3g} vs {ref} {t['reference']:.3g}, BF16 "
            f"{t['bf16']:.3g}: {by}, {need}")


def _why(chosen: dict, cands: dict[str, dict], k: int | None) -> str:
    ref = chosen["reference"]
    if len(cands) == 1:
        return f"only {ref} was run"
    if chosen["no_baseline"]:
        return f"no BF16 baseline finished, so no correction can be shown closer to it: {ref}"
    detail = "; ".join(f"{c}: " + ("; ".join(_test_text(t, ref, k) for t in ts) or "no data")
                       for c, ts in chosen["tests"].items())
    if not chosen["passed"]:
        if ref == "none":
            return f"none, no correction needed: none is distinguishable from running without one ({detail})"
        return f"{ref}, the cheapest run; no other is distinguishable from it ({detail})"
    rest = [c for c in chosen["passed"] if c != chosen["choice"]]
    tail = f"; {', '.join(rest)} also pass{'es' if len(rest) == 1 else ''}, {chosen['choice']} is cheaper" if rest else ""
    return f"{chosen['choice']} (closer to BF16 than {ref} by more than the seed spread and {MARGIN:.0%} of the " \
           f"difference; {detail}{tail})"


def acceptance(group: dict, base: dict | None) -> dict:
    """Is ``group`` within tolerance of BF16 in recent reward and held-out accuracy?"""
    if base is None:
        return {"acceptable": None, "checks": [], "one_seed": False,
                "text": "not judged vs BF16: no BF16 baseline finished"}
    checks, missing, unknown, assumed = [], [], False, None
    k = last_k(group)
    for name in CRITERIA:
        a, b = criterion_stats(group, name), criterion_stats(base, name)
        if _mean(a) is None or _mean(b) is None:
            missing.append(criterion_name(name, k))
            continue
        spread, borrowed = acceptance_spread(a, b)
        unknown |= spread is None
        assumed = assumed or borrowed
        tol = FLOOR if spread is None else max(FACTOR * spread, FLOOR)
        diff = a["mean"] - b["mean"]
        checks.append({"criterion": name, "value": a["mean"], "bf16": b["mean"], "diff": diff, "tolerance": tol,
                       "spread": spread, "spread_from": borrowed, "within": abs(diff) <= tol})
    one_seed = unknown or assumed is not None
    if not checks:
        return {"acceptable": None, "checks": [], "one_seed": False,
                "text": f"not judged vs BF16: no {' or '.join(missing)} measured"}
    ok = all(c["within"] for c in checks)
    detail = "; ".join(f"{criterion_name(c['criterion'], k)} {c['value']:.3g} vs BF16 {c['bf16']:.3g}: "
                       f"{c['diff']:+.3g}, {'within' if c['within'] else 'beyond'} ±{c['tolerance']:.3g}"
                       for c in checks)
    head = "acceptable vs BF16" if ok else "NOT acceptable vs BF16"
    if unknown:
        head += f" by the point estimate (1 seed: spread unknown, tolerance {FLOOR:g})"
    elif assumed:
        head += (f" by the point estimate (1 seed: spread taken from {assumed} seeds, sqrt(2) x their std; "
                 f"tolerance max({FACTOR:g} x that, {FLOOR:g}))")
    if missing:
        detail += f"; {' and '.join(missing)} not measured"
    return {"acceptable": ok, "checks": checks, "one_seed": one_seed, "text": f"{head} ({detail})"}


def _percent(share: float) -> str:
    """A share as a percentage that never rounds a non-zero share to 0.0%."""
    return "0.0%" if share == 0 else f"{100 * share:.2g}%" if share < 0.001 else f"{share:.1%}"


LEVEL_WORDS = {"token": ("", "tokens"), "sequence": (" at sequence level", "sequences"),
               "geometric": (" at geometric-mean level", "sequences")}  # --tis-level: what one ratio is over
ESS_SHOWN_BELOW = 0.99  # a weighting that keeps nearly the whole batch needs no effective-sample-size note


def _weighting(correction: str) -> tuple[str | None, str, str]:
    """(tis / mask / None, the name a reader sees, the unit its ratios are over) of a correction,
    read from the train flags compare runs it with (matrix.py)."""
    args = {**CORRECTION_ARGS, **LEVELED}.get(correction, ())
    if "--use-tis" not in args:
        return None, correction, "tokens"
    kind = "mask" if "mask" in args else "tis"  # --tis-mode mask; truncation (TIS) otherwise
    suffix, unit = LEVEL_WORDS[args[args.index("--tis-level") + 1] if "--tis-level" in args else "token"]
    return kind, ("TIS" if kind == "tis" else "mask") + suffix, unit


def _ess(means: dict, unit: str) -> str:
    """The effective sample size the weights left, where it fell below ESS_SHOWN_BELOW: at sequence
    level a long response's ratio is a product over its tokens, and the batch shrinks with it."""
    ess = _mean(means.get("ess_ratio"))
    return "" if ess is None or ess >= ESS_SHOWN_BELOW else \
        f"; its weights left an effective sample size of {ess:.0%} of the batch's {unit}"


def evidence(cands: dict[str, dict]) -> list[str]:
    """What each correction did, from its runs' own metrics, and the gap each left (reported, not chosen on)."""
    out = []
    gaps = [(c, _mean(g["gap_mean"][MAIN_GAP])) for c, g in sorted(cands.items(), key=lambda kv: _cost(kv[0]))]
    if len(gaps) > 1 and all(v is not None for _, v in gaps):
        out.append("mean |logp diff| over steps (reported, not chosen on): "
                   + ", ".join(f"{c} {v:.3g}" for c, v in gaps))
    for corr, g in cands.items():
        means, ext = g.get("metrics_mean", {}), g.get("extremes", {})
        lo, hi = ext.get("tis_ratio_min"), ext.get("tis_ratio_max")
        span = f"[{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None else None
        kind, name, unit = _weighting(corr)
        if kind == "tis" and _mean(means.get("tis_clipfrac")) is not None:
            clip = means["tis_clipfrac"]["mean"]
            if span and clip == 0:
                line = f"{name} clipped 0.0% of {unit}: the ratios never left {span}"
            else:
                line = f"{name} clipped {_percent(clip)} of {unit}" + (f"; the ratios ranged over {span}" if span else "")
            out.append(line + _ess(means, unit))
        if kind == "mask" and _mean(means.get("masked_fraction")) is not None:
            out.append(f"{name} dropped {_percent(means['masked_fraction']['mean'])} of tokens"
                       + (f"; the ratios ranged over {span}" if span else "") + _ess(means, unit))
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
    k = last_k(groups[0])
    why = _why(chosen, cands, k)
    proof = evidence(cands)
    seeds = seeds_line(cands, base)
    text = f"{label}: {accept['text']}. Correction: {why}. The answer {seeds}"
    if proof:
        text += ". " + "; ".join(proof)
    candidates = [{"correction": c, "group": g["id"], **{name: criterion_stats(g, name) for name in REPORTED},
                   "acceptance": acceptance(g, base)} for c, g in sorted(cands.items(), key=lambda kv: _cost(kv[0]))]
    one_seed = accept["one_seed"] or any(t["need"] is None for ts in chosen["tests"].values() for t in ts)
    return {"mode": mode, "label": label, "emulated": any(g["emulated"] for g in groups), "candidates": candidates,
            "choice": chosen["choice"], "reference": chosen["reference"], "passed": chosen["passed"],
            "tests": chosen["tests"], "last_k": k, "seeds": min(g["n_runs"] for g in groups),
            "one_seed": one_seed, "acceptable": accept["acceptable"],
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

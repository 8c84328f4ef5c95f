"""Which correction to use with each low-precision mode, and whether the mode pays for speed.

For every non-bf16 mode, each correction that was run is judged on two criteria against
the bf16 baseline group: (a) the mean gap over steps (train_rollout_logprob_abs_diff),
closest to bf16's, and (b) the reward over the steps, closest to bf16's. The correction
closest on a criterion is named only where the difference to the others exceeds the
seed-to-seed spread (stats.difference); otherwise the study says "no significant
difference", and with one seed "1 seed: spread unknown". A criterion that is not
decided is never turned into a recommendation.
"""

from __future__ import annotations

from quantroll.compare.perrun import MAIN_GAP
from quantroll.compare.speed import verdict
from quantroll.compare.stats import NO_DIFFERENCE, NO_SPREAD, difference


def fmt_stat(s: dict | None) -> str:
    """'m ± s (n=k)' with 3 significant digits; 'n/a' without data."""
    if not s or s.get("mean") is None:
        return "n/a"
    spread = f" ± {s['std']:.3g}" if s.get("std") is not None else ""
    return f"{s['mean']:.3g}{spread} (n={s['n']})"


def _candidate(g: dict, base: dict | None) -> dict:
    gap, reward = g["gap_mean"][MAIN_GAP], g["reward"]["mean"]
    base_gap = base["gap_mean"][MAIN_GAP] if base else None
    base_reward = base["reward"]["mean"] if base else None
    gap_to = (abs(gap["mean"] - (base_gap["mean"] if base_gap and base_gap["mean"] is not None else 0.0))
              if gap["mean"] is not None else None)
    rdiff = (reward["mean"] - base_reward["mean"]
             if base_reward and None not in (reward["mean"], base_reward["mean"]) else None)
    return {
        "group": g["id"], "correction": g["correction"], "gap": gap, "gap_to_bf16": gap_to,
        "gap_vs_bf16": difference(gap, base_gap) if base_gap else None,
        "reward": reward, "reward_diff": rdiff,
        "reward_vs_bf16": difference(reward, base_reward) if base_reward else None,
    }


def criterion(cands: list[dict], stat: str, distance) -> dict:
    """Best candidate by ``distance`` and its difference (other - best) to every other one."""
    scored = [(distance(c), c) for c in cands if distance(c) is not None]
    if not scored:
        return {"best": None, "comparisons": [], "decided": False, "text": "no data"}
    best = min(scored, key=lambda t: t[0])[1]
    comps = [{"other": c["correction"], **difference(c[stat], best[stat])} for _, c in scored if c is not best]
    sig = [c["other"] for c in comps if c["significant"]]
    if not comps:
        text = f"{best['correction']} (the only correction with data)"
    elif any(c["significant"] is None for c in comps):
        text = f"{best['correction']} closest by point estimate; {NO_SPREAD}"
    elif not sig:
        text = NO_DIFFERENCE
    elif len(sig) == len(comps):
        text = f"{best['correction']}, closer than {', '.join(sig)} beyond the seed spread"
    else:
        same = [c["other"] for c in comps if not c["significant"]]
        text = (f"{best['correction']}, closer than {', '.join(sig)} beyond the seed spread; "
                f"{NO_DIFFERENCE} from {', '.join(same)}")
    decided = bool(comps) and len(sig) == len(comps)
    return {"best": best["correction"], "comparisons": comps, "decided": decided, "text": text}


def _choice(cands: list[dict], by_gap: dict, by_reward: dict) -> tuple[str | None, str]:
    if len(cands) == 1:
        return cands[0]["correction"], f"only {cands[0]['correction']} was run"
    g, r = by_gap, by_reward
    if g["decided"] and r["decided"]:
        if g["best"] == r["best"]:
            return g["best"], f"{g['best']}: closest to bf16 in gap and in reward"
        return None, f"trade-off: {g['best']} keeps the gap closest, {r['best']} the reward"
    if g["decided"] or r["decided"]:
        best, what, other, other_what = (g, "gap", r, "reward") if g["decided"] else (r, "reward", g, "gap")
        return best["best"], f"{best['best']}: closest to bf16 in {what}; {other_what}: {other['text']}"
    if any(c["significant"] is None for c in g["comparisons"] + r["comparisons"]):
        return None, f"{NO_SPREAD}: point estimates favour {g['best']} (gap) and {r['best']} (reward)"
    if not any(c["significant"] for c in g["comparisons"] + r["comparisons"]):
        return None, f"{NO_DIFFERENCE} between corrections"
    return None, "no single correction is closest beyond the seed spread on either criterion"


def _mode_entry(mode: str, groups: list[dict], base: dict | None) -> dict:
    cands = [_candidate(g, base) for g in groups]
    by_gap = criterion(cands, "gap", lambda c: c["gap_to_bf16"])
    if base:
        by_reward = criterion(cands, "reward", lambda c: abs(c["reward_diff"]) if c["reward_diff"] is not None else None)
    else:  # nothing to be close to: the highest reward is the best one can say
        by_reward = criterion(cands, "reward", lambda c: -c["reward"]["mean"] if c["reward"]["mean"] is not None else None)
    choice, why = _choice(cands, by_gap, by_reward)
    label = groups[0]["label"] if all(g["label"] == groups[0]["label"] for g in groups) else mode
    numbers = "; ".join(
        f"{c['correction']}: gap {fmt_stat(c['gap'])}, reward {fmt_stat(c['reward'])}"
        + (f" ({c['reward_diff']:+.3g} vs bf16, {c['reward_vs_bf16']['note']})" if c["reward_diff"] is not None else "")
        for c in cands)
    text = f"{label}: {why}. Gap: {by_gap['text']}. Reward: {by_reward['text']}. [{numbers}]"
    if not base:
        text += " (no bf16 baseline ran: reward judged by its highest value)"
    return {"mode": mode, "label": label, "emulated": any(g["emulated"] for g in groups), "candidates": cands,
            "by_gap": by_gap, "by_reward": by_reward, "choice": choice, "text": text}


def recommend(groups: list[dict], base: dict | None) -> dict:
    modes: dict[str, list[dict]] = {}
    for g in groups:
        if g["precision"] != "bf16":
            modes.setdefault(g["mode"], []).append(g)
    entries = [_mode_entry(m, gs, base) for m, gs in modes.items()]
    verdicts = []
    for m, gs in modes.items():
        g = next((x for x in gs if x["correction"] == "none"), gs[0])
        verdicts.append({"mode": m, "group": g["id"], "pays": (g.get("speed") or {}).get("pays"), "text": verdict(g)})
    return {"baseline": base["id"] if base else None, "modes": entries, "verdicts": verdicts}

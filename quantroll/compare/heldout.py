"""Does what the training reward says survive on problems the policy never trained on?

The built-in task trains on a fixed pool of problems, so a rising reward can mean the
policy learned the task or that it memorised its pool. Held-out accuracy (problems
outside the pool, greedy, measured at step 0 and at the eval interval) tells the two
apart; this module says when they disagree: the training reward rose beyond the seed
spread from the first steps to the last (means over a few steps at each end, see
perrun.reward_window: one step's reward is too noisy) while held-out accuracy, from its
first eval (step 0) to its last, did not.
"""

from __future__ import annotations

import math

from quantroll.compare.perrun import reward_window
from quantroll.compare.recommend import FLOOR


def rise(first: dict | None, last: dict | None) -> dict | None:
    """last - first, and whether it exceeds max(seed spread, FLOOR) (FLOOR alone with one seed)."""
    if not first or not last or first.get("mean") is None or last.get("mean") is None:
        return None
    spread = (math.hypot(first["std"], last["std"])
              if first.get("std") is not None and last.get("std") is not None else None)
    threshold = FLOOR if spread is None else max(spread, FLOOR)
    diff = last["mean"] - first["mean"]
    return {"first": first["mean"], "last": last["mean"], "diff": diff, "threshold": threshold,
            "one_seed": spread is None, "rose": diff > threshold}


def memorisation_warnings(groups: list[dict]) -> list[str]:
    """One line per group whose training reward rose while held-out accuracy did not."""
    out = []
    for g in groups:
        ev = g.get("eval")
        if not ev or ev["first_steps"] == ev["steps"]:
            continue  # one eval point: nothing to compare
        reward = rise(g["reward"]["first_steps"], g["reward"]["last_steps"])
        held = rise(ev["first_trainer"], ev["trainer"])
        if not reward or not held or not reward["rose"] or held["rose"]:
            continue
        basis = f"1 seed: point estimates against {FLOOR:g}" if reward["one_seed"] or held["one_seed"] else \
            "beyond max(seed spread, 0.02)"
        w = reward_window(g["num_steps"])
        out.append(f"{g['label']} / {g['correction']}: the training reward rose {reward['first']:.3g} -> "
                   f"{reward['last']:.3g} (means of the first and last {w} steps, {reward['diff']:+.3g}; {basis}) "
                   f"but held-out accuracy did not rise beyond {held['threshold']:.3g} "
                   f"({held['first']:.3g} -> {held['last']:.3g}, trainer's policy, steps {ev['first_steps'][0]} -> "
                   f"{ev['steps'][-1]}): the policy may be fitting its pool of training problems, not the task")
    return out


def baseline_check(base: dict | None) -> dict | None:
    """Did the BF16 baseline keep its held-out accuracy? Its trainer's policy at the last eval
    against step 0's, allowing the seed spread sqrt(std_first^2 + std_last^2) (0 with one seed,
    and then ``one_seed``). None without a baseline or with one eval point."""
    ev = (base or {}).get("eval")
    if not ev or ev["first_steps"] == ev["steps"]:
        return None
    first, last = ev["first_trainer"], ev["trainer"]
    if first.get("mean") is None or last.get("mean") is None:
        return None
    known = first.get("std") is not None and last.get("std") is not None
    spread = math.hypot(first["std"], last["std"]) if known else None
    floor = first["mean"] - (spread or 0.0)
    return {"first": first["mean"], "last": last["mean"], "first_step": ev["first_steps"][0],
            "last_step": ev["steps"][-1], "spread": spread, "floor": floor, "one_seed": not known,
            "seeds": last.get("n"), "fell": last["mean"] < floor}


def baseline_warning(check: dict | None) -> str | None:
    """The line that leads the report when the BF16 baseline unlearned (see baseline_check)."""
    if not check or not check["fell"]:
        return None
    spread = "1 seed: no spread" if check["one_seed"] else f"beyond the seed spread {check['spread']:.3g}"
    return (f"the BF16 baseline's held-out accuracy fell {check['first']:.3g} -> {check['last']:.3g} (trainer's "
            f"policy, steps {check['first_step']} -> {check['last_step']}; {spread}): a baseline that unlearns "
            "cannot rank corrections, so read the correction above with care; a lower --lr or a larger problem pool "
            "(--train-args \"--lr ... --train-problems 0\") keeps it")

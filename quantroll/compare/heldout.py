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
                   "but held-out accuracy did not "
                   f"({held['first']:.3g} -> {held['last']:.3g}, trainer's policy, steps {ev['first_steps'][0]} -> "
                   f"{ev['steps'][-1]}): the policy may be fitting its pool of training problems, not the task")
    return out

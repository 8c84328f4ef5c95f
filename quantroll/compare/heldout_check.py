"""CI's check of the main command's study: the BF16 baseline must not unlearn.

A baseline whose held-out accuracy falls cannot rank corrections (every group then
drifts the same way and the differences between them are about forgetting), so CI runs
the README's main command and then

    python -m quantroll.compare.heldout_check quantroll-compare/summary.json

which exits 1 with one line naming the numbers when the BF16 group's held-out accuracy
(trainer's policy) at its last eval is below step 0's minus the seed spread
(heldout.baseline_check), and 2 when the summary cannot say (no baseline, one eval, an
unreadable file). Exit 0 prints the numbers it checked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from quantroll.compare.heldout import baseline_check

PROG = "quantroll.compare.heldout_check"


def verdict(summary: dict) -> tuple[int, str]:
    """(exit code, the line to print) for a summary.json's content."""
    base = next((g for g in summary.get("groups", []) if g.get("id") == summary.get("baseline")), None)
    if base is None:
        return 2, "no BF16 baseline group in the summary: run the default compare (it includes bf16)"
    check = baseline_check(base)
    if check is None:
        return 2, (f"the baseline {base['id']} has no held-out accuracy at two eval steps: run compare with "
                   "--eval-interval > 0 and more than one step")
    spread = "no seed spread (1 seed)" if check["one_seed"] else f"seed spread {check['spread']:.3g}"
    numbers = (f"BF16 held-out accuracy {check['first']:.3g} at step {check['first_step']} -> {check['last']:.3g} "
               f"at step {check['last_step']} ({check['seeds']} seeds; {spread}; floor {check['floor']:.3g})")
    if check["fell"]:
        return 1, f"{numbers}: the baseline unlearned; the default recipe (compare's --lr / --train-problems) needs fixing"
    return 0, f"{numbers}: held"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {PROG} SUMMARY_JSON", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        print(f"{PROG}: error: {path}: cannot read it as JSON ({err})", file=sys.stderr)
        return 2
    code, line = verdict(summary)
    print(f"{PROG}: {'error: ' if code else ''}{line}", file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())

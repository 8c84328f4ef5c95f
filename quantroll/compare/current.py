"""Which runs of a compare directory belong to the matrix being reported.

``OUT/runs`` keeps every run a compare ever made there, so that rerunning a command
continues it. But a rerun with another matrix (other precisions, seeds, corrections)
must not rank the old runs against the new baseline: the report covers the runs of
the current matrix only, and lists the others as stale (kept on disk, so that rerunning
their matrix reuses them; deleting them is the user's call).
"""

from __future__ import annotations

from quantroll.compare.matrix import RunSpec
from quantroll.compare.rundata import RunData


def split_current(runs: list[RunData], specs: list[RunSpec]) -> tuple[list[RunData], list[RunData]]:
    """(runs of this matrix, runs of an earlier one)."""
    wanted = {s.run_id for s in specs}
    return [r for r in runs if r.run_id in wanted], [r for r in runs if r.run_id not in wanted]


def note_stale(summary: dict, stale: list[RunData]) -> dict:
    """Record the stale runs in the summary (``stale_runs``, and a warning the report shows)."""
    ids = sorted(r.run_id for r in stale)
    summary["stale_runs"] = ids
    if ids:
        shown = ", ".join(ids[:6]) + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")
        summary.setdefault("warnings", []).append(
            f"{len(ids)} run(s) in runs/ belong to an earlier matrix and are not part of this study (not ranked): "
            f"{shown}; rerun their matrix to report them, or delete them")
    return summary

"""Mean, spread over seeds, and when a difference between two groups counts.

Every aggregate in the study is taken over seeds (one number per run), with the
sample standard deviation (ddof=1), so that a difference between two groups counts only
when it exceeds the combined seed-to-seed spread sqrt(std_a^2 + std_b^2). With one seed
there is no spread, and the study says so instead of calling anything significant.

Non-finite values (the metrics sink writes NaN/Inf as the strings "nan"/"inf") are
left out of every mean; the result is JSON-safe: None where there is no data.
"""

from __future__ import annotations

import math
import statistics

NO_SPREAD = "1 seed: spread unknown"
NO_DIFFERENCE = "no significant difference"
SIGNIFICANT = "significant"


def as_float(value) -> float | None:
    """A metric value as a float (numbers and the sink's "nan"/"inf" strings), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def finite(values) -> list[float]:
    out = []
    for v in values:
        f = as_float(v)
        if f is not None and math.isfinite(f):
            out.append(f)
    return out


def mean(values) -> float | None:
    vals = finite(values)
    return statistics.fmean(vals) if vals else None


def stats(values) -> dict:
    """{"mean", "std" (ddof=1; None below 2 values), "n"} over the finite values."""
    vals = finite(values)
    n = len(vals)
    return {
        "mean": statistics.fmean(vals) if n else None,
        "std": statistics.stdev(vals) if n >= 2 else None,
        "n": n,
    }


def difference(a: dict, b: dict) -> dict:
    """a - b with its significance: counts only if |diff| > sqrt(std_a^2 + std_b^2)."""
    if a.get("mean") is None or b.get("mean") is None:
        return {"diff": None, "spread": None, "significant": None, "note": "no data"}
    diff = a["mean"] - b["mean"]
    if a.get("std") is None or b.get("std") is None:
        return {"diff": diff, "spread": None, "significant": None, "note": NO_SPREAD}
    spread = math.hypot(a["std"], b["std"])
    significant = abs(diff) > spread
    return {"diff": diff, "spread": spread, "significant": significant,
            "note": SIGNIFICANT if significant else NO_DIFFERENCE}

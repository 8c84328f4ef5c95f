"""What stayed in high precision in each checkpoint a study runs on, and why.

"FP8" in a report means little unless the reader knows which weights were FP8: a
checkpoint whose attention stayed BF16 (partial blocks, fused siblings) understates
what FP8 does to a model that quantizes it. So the compare command records, for every
checkpoint its runs load, what ``quantroll inspect`` reports (the same function, its
own reasons and rules), and the report lists it: how many modules were quantized, and
per keep rule the count, the names and the rule.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantroll.checkpoint.atomic import atomic_write_text
from quantroll.checkpoint.plan import REASONS
from quantroll.checkpoint.stats import inspect_checkpoint, kept_by_reason

INVENTORY_FILE = "checkpoints.json"
NOT_LINEAR = frozenset({"embedding", "norm", "not-2d", "not-a-weight"})  # kept reasons of non-linear tensors


def checkpoint_inventory(precision: str, path: str | Path) -> dict:
    """One checkpoint, as inspect sees it (JSON-safe)."""
    report = inspect_checkpoint(path)
    return {
        "precision": precision, "path": str(path), "format": report.format, "scale_rule": report.scale_rule,
        "quantized": len(report.quantized),
        "linears_kept": sum(1 for reason in report.kept.values() if reason not in NOT_LINEAR),
        "kept": [{"reason": reason, "rule": REASONS.get(reason, "kept by the checkpoint producer"),
                  "count": len(names), "names": sorted(names)} for reason, names in kept_by_reason(report.kept).items()],
        "total_bytes": report.total_bytes, "bytes_by_dtype": report.bytes_by_dtype,
    }


def write_inventory(out_dir: str | Path, checkpoints: dict[str, Path]) -> Path:
    """OUT/checkpoints.json: the inventory of every checkpoint of the study (precision -> path)."""
    rows = [checkpoint_inventory(p, path) for p, path in checkpoints.items()]
    path = Path(out_dir) / INVENTORY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(rows, indent=1) + "\n")
    return path


def load_inventory(out_dir: str | Path) -> list[dict]:
    """What write_inventory left (an empty list when there is none, or it is unreadable)."""
    try:
        rows = json.loads((Path(out_dir) / INVENTORY_FILE).read_text())
    except (OSError, ValueError):
        return []
    return rows if isinstance(rows, list) else []


def describe(row: dict, show: int = 4) -> str:
    """One line: '<precision> (<format>): N modules quantized; kept: lm_head 1 (output head: lm_head), ...'."""
    if row["format"] == "bf16":
        return f"{row['precision']}: the BF16 source, nothing quantized"
    kept = []
    for k in row["kept"]:
        names = ", ".join(k["names"][:show]) + (f", ... and {k['count'] - show} more" if k["count"] > show else "")
        kept.append(f"{k['count']} {k['reason']} ({k['rule']}: {names})")
    rule = f", scale rule {row['scale_rule']}" if row.get("scale_rule") else ""
    return (f"{row['precision']} ({row['format']}{rule}): {row['quantized']} modules quantized; kept in BF16: "
            + ("; ".join(kept) if kept else "nothing"))

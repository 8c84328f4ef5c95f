"""Names a reader sees: the precision mode of a run, and the "(emulated)" mark.

The runner records what a run did (rollout precision, whether the trainer's forward is
quantized the same way); the study talks in the four modes of docs/train.md. The mapping lives
here once so that tables, plots and the recommendation can never disagree on a name.
"""

from __future__ import annotations

from quantroll.compare.matrix import CORRECTIONS, PRECISIONS
from quantroll.formats import display_name, format_class, format_names

PRECISION_ORDER = PRECISIONS
CORRECTION_ORDER = CORRECTIONS
BASELINE_MODE = "bf16"


def mode_label(precision: str, unified: bool, kv_cache_dtype: str = "bf16", bf16_exceptions: bool = False) -> str:
    """bf16 -> the baseline; quantized rollout with a BF16 trainer -> mode 1; unified -> modes
    2/3/4; an FP8 KV cache in the engine is named in each (the trainer never uses one)."""
    kv = kv_cache_dtype == "fp8"
    if precision == "bf16":
        return "fp8 KV rollout, BF16 train" if kv else BASELINE_MODE
    if not unified:
        exceptions = " with BF16 exceptions" if bf16_exceptions else ""
        return f"mode 1: {precision}{' + fp8 KV' if kv else ''} rollout{exceptions}, BF16 train"
    # the CLI's mode number and the display name: the format's own facts (a report may name a format not registered now)
    number = format_class(precision).unified_mode if precision in format_names() else None
    name = f"mode {number}: {display_name(precision)}" if number else f"unified {display_name(precision)}"
    return (name + (", fp8 KV in the engine" if kv else "")
            + (", BF16 exceptions" if bf16_exceptions else ""))


def display(label: str, emulated: bool) -> str:
    """The label as printed: emulated precisions are marked wherever they appear."""
    return f"{label} (emulated)" if emulated else label


def group_id(label: str, correction: str) -> str:
    return f"{label} / {correction}"


def sort_key(precision: str, unified: bool, correction: str, kv_cache_dtype: str = "bf16",
             bf16_exceptions: bool = False) -> tuple:
    """bf16 first, then mode 1 by precision, then modes 2-4, each BF16 KV before FP8 KV;
    corrections in CLI order."""
    def rank(seq, value):
        return (seq.index(value), "") if value in seq else (len(seq), str(value))

    mode_rank = 0 if precision == "bf16" else (2 if unified else 1)
    return (mode_rank, rank(PRECISION_ORDER, precision), kv_cache_dtype != "bf16", bf16_exceptions,
            rank(CORRECTION_ORDER, correction))

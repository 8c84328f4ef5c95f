"""``quantroll inspect``: what a checkpoint holds and how much quantization cost it.

Prints the format, quantized vs kept modules (kept ones grouped by reason), bytes
per stored dtype and, with --against, the SQNR of every quantized weight against the
BF16 checkpoint it was made from (the worst --top first). --json writes it all.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

from quantroll.checkpoint.integrity import stored_problems
from quantroll.checkpoint.plan import REASONS
from quantroll.checkpoint.stats import InspectReport, inspect_checkpoint, kept_by_reason
from quantroll.commands.helpformat import HelpFormatter
from quantroll.outputs import REPORT_RULE, check_report_file, write_report

_SHOW = 6  # names listed per kept reason before "... and N more"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="summarize a checkpoint: format, kept vs quantized, bytes, SQNR against BF16",
        description="Summarize a checkpoint (quantized or not). With --against, measure the SQNR of every "
        "quantized weight against the BF16 checkpoint it was made from, and check kept tensors are unchanged.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="checkpoint directory to inspect (required)")
    p.add_argument(
        "--against",
        metavar="BF16_DIR",
        default=None,
        help="BF16 source checkpoint: report SQNR (dB, float64 sums) per quantized weight. Default: no comparison",
    )
    p.add_argument("--top", type=int, default=10, metavar="N", help="how many of the worst-SQNR weights to list (default: 10)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the full report as JSON to FILE; " + REPORT_RULE + " (default: none)")
    p.set_defaults(func=run)


def _db(v: float) -> str:
    return f"{v:8.2f}" if math.isfinite(v) else f"{v!s:>8}"


def format_report(r: InspectReport, top: int) -> str:
    lines = [f"checkpoint: {r.path}"]
    fmt = r.format + (f" (scale rule {r.scale_rule})" if r.scale_rule else "")
    lines.append(f"format:     {fmt}; produced by {r.producer}")
    lines.append(f"tensors:    {r.num_tensors} in {r.num_files} file(s)")
    lines.append(f"modules:    {len(r.quantized)} quantized, {len(r.kept)} kept in source precision")
    for reason, modules in kept_by_reason(r.kept).items():
        shown = ", ".join(modules[:_SHOW]) + (f", ... and {len(modules) - _SHOW} more" if len(modules) > _SHOW else "")
        lines.append(f"  kept {len(modules):4d} {reason} ({REASONS.get(reason, 'kept by the checkpoint producer')}): {shown}")
    lines.append("bytes by dtype:")
    for dtype, n in r.bytes_by_dtype.items():
        lines.append(f"  {dtype:8s} {n:14,d}  {100 * n / max(r.total_bytes, 1):5.1f}%")
    lines.append(f"  {'total':8s} {r.total_bytes:14,d}")
    if r.against is not None:
        finite = [v for v in r.sqnr_db.values() if not math.isnan(v)]
        lines.append(f"SQNR vs {r.against} (dB, float64 sums), {len(r.sqnr_db)} quantized weights:")
        if finite:
            lines.append(f"  min {_db(min(finite))}  median {_db(statistics.median(finite))}  max {_db(max(finite))}")
        lines.append(f"worst {min(top, len(r.sqnr_db))}:")
        for module, v in r.worst(top):
            lines.append(f"  {_db(v)}  {module}")
        unmeasured = len(r.sqnr_db) - len(finite)
        if unmeasured:
            lines.append(f"  {unmeasured} weight(s) without a number (NaN: all-zero, or non-finite values), listed last")
        if r.kept_mismatch:
            lines.append(f"WARNING: {len(r.kept_mismatch)} kept tensor(s) differ from --against: {', '.join(r.kept_mismatch[:_SHOW])}")
        else:
            lines.append("kept tensors: identical to --against")
    for problem in getattr(r, "problems", []):
        lines.append(f"ERROR: {problem}")
    return "\n".join(lines)


def _check_args(args: argparse.Namespace) -> None:
    """--top and --against are checked before any work: a negative count, or a source that
    is not there, is one line (an unquantized DIR would otherwise skip --against unread)."""
    from pathlib import Path

    from quantroll.checkpoint.reader import CheckpointReader
    from quantroll.errors import QuantrollError

    if args.top < 0:
        raise QuantrollError(f"--top must be >= 0 (how many of the worst weights to list), got {args.top}")
    if args.against is not None:
        against = Path(args.against)
        if not against.is_dir():
            what = "not a directory" if against.exists() else "no such directory"
            raise QuantrollError(f"--against {args.against}: {what}; give the BF16 checkpoint DIR was made from")
        with CheckpointReader(against) as reader:  # a directory that is not a checkpoint: its own one line
            _refuse_quantized_reference(reader)
    if args.json:
        check_report_file("--json", args.json)


def _refuse_quantized_reference(reader) -> None:
    """SQNR is measured against the BF16 weights: against a quantized checkpoint it compared
    FP8 codes with dequantized values and printed meaningless figures (0.00 dB against itself)."""
    from quantroll.checkpoint.convert import check_source
    from quantroll.errors import QuantrollError

    try:
        check_source(reader)  # convert's own test of "already quantized"
    except QuantrollError:
        raise QuantrollError(f"--against {reader.path} is a quantized checkpoint; give the BF16 checkpoint DIR was "
                             "made from") from None


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    report = inspect_checkpoint(args.dir, args.against)
    problems = stored_problems(args.dir)
    report.problems = problems
    print(format_report(report, args.top))
    if args.against is not None and report.against is None:
        print(f"--against: {args.dir} holds no quantized weights, so there is nothing to compare with {args.against}")
    if args.json:
        write_report("--json", args.json, report.to_json(args.top))
    if problems:  # the checkpoint is damaged: the summary above is printed, the exit status says so
        more = f" (and {len(problems) - 1} more: see above)" if len(problems) > 1 else ""
        print(f"quantroll inspect: error: {args.dir}: {problems[0]}{more}; the checkpoint is damaged: convert it again "
              "from its BF16 source", file=sys.stderr)
        return 1
    return 0

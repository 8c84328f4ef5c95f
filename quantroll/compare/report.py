"""Write the study of a compare directory: summary.json, plots/*.png, report.md, report.html.

Each file is written to a temporary name and renamed, so a reader (or a second
`quantroll compare` pass over a growing matrix) never sees half a report.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantroll.compare.answer import answer
from quantroll.compare.cells import Table
from quantroll.compare.tables import build_tables
from quantroll.durable import write_atomic


def _write(path: Path, text: str) -> Path:
    write_atomic(path, text)  # a full disk or Ctrl-C leaves the old file and no temporary one
    return path


def write_report(out_dir, summary: dict) -> dict[str, Path]:
    """Write everything under out_dir; returns {relative path: path} of the files written."""
    from quantroll.compare.htmlpage import render_html
    from quantroll.compare.markdown import render_markdown
    from quantroll.compare.plots import write_plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {"summary.json": _write(out / "summary.json", json.dumps(summary, indent=1, allow_nan=False) + "\n")}
    plots = write_plots(summary, out / "plots")
    written.update({f"plots/{name}": path for name, path in plots.items()})
    written["report.md"] = _write(out / "report.md", render_markdown(summary, plots))
    written["report.html"] = _write(out / "report.html", render_html(summary, plots))
    return written


def table_text(t: Table) -> str:
    """Fixed-width text: columns padded to their widest cell; notes as '- ' lines below."""
    cols = [t.headers] + t.rows
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(t.headers))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    out = [t.title, "=" * len(t.title), line(t.headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in t.rows] or ["(no data)"]
    out += [f"- {n}" for n in t.notes]
    return "\n".join(out)


def terminal_tables(summary: dict) -> str:
    """The answer (one line per mode, the rule, the warnings), then the main tables: gap at step 0,
    time/speedup/break-even, recommendation."""
    keep = ("gap_step0", "time", "recommendation", "failed")
    tables = {t.key: t for t in build_tables(summary, compact=True)}
    head = "Answer\n======\n" + "\n".join(f"- {line}" for line in answer(summary))
    head += "".join(f"\n- Warning: {w}" for w in summary["warnings"])
    return "\n\n".join([head] + [table_text(tables[k]) for k in keep if k in tables]) + "\n"

"""Tables + plots -> one self-contained report.html (inline CSS, PNGs as base64 data URIs).

Every piece of text goes through html.escape: run ids, errors and model paths come
from the runs and may hold anything.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from quantroll.compare.answer import answer, preamble
from quantroll.compare.bylength import by_length_tables
from quantroll.compare.cells import Table
from quantroll.compare.tables import build_tables, plots_after

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
div.scroll { overflow-x: auto; } th { background: #f2f2f2; } tr:nth-child(even) td { background: #fafafa; }
ul.legend { font-size: 0.8em; color: #555; } ul.notes { font-size: 0.9em; } ul.answer { font-size: 1.05em; }
code { background: #f4f4f4; padding: 0 3px; } img { max-width: 100%; margin: 0.5em 0; }
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _text(text) -> str:
    """Escaped prose, with Markdown's `code` spans as <code> (a literal backtick would show as one)."""
    parts = _e(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no span to make, and no backtick to show
        return "".join(parts)
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def table_html(t: Table) -> str:
    parts = [f"<h2>{_e(t.title)}</h2>"]
    if t.rows:
        head = "".join(f"<th>{_text(h)}</th>" for h in t.headers)
        body = "".join("<tr>" + "".join(f"<td>{_text(c)}</td>" for c in row) + "</tr>" for row in t.rows)
        parts.append(f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')
    else:
        parts.append("<p><em>no data</em></p>")
    if t.legend:
        parts.append('<ul class="legend">' + "".join(f"<li><code>{_e(k)}</code>: {_text(v)}</li>" for k, v in t.legend)
                     + "</ul>")
    if t.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_text(n)}</li>" for n in t.notes) + "</ul>")
    return "\n".join(parts)


def img_html(name: str, path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{_e(name)}" src="data:image/png;base64,{data}">'


def render_html(summary: dict, plots: dict) -> str:
    body = ["<h1>quantroll compare: low-precision rollout study</h1>",
            '<ul class="answer">' + "".join(f"<li><strong>{_text(line)}</strong></li>" for line in answer(summary)) + "</ul>",
            "<ul>" + "".join(f"<li>{_text(line)}</li>" for line in preamble(summary)) + "</ul>"]
    tables = build_tables(summary) + by_length_tables(summary)  # per group, by length bucket
    after = plots_after(tables)
    for t in tables:
        body.append(table_html(t))
        body += [img_html(n, plots[n]) for n in after.get(t.key, ()) if n in plots]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>quantroll compare</title><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")

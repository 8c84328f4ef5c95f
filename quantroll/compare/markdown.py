"""Tables -> report.md (GitHub-flavoured Markdown; plots referenced as plots/*.png)."""

from __future__ import annotations

from quantroll.compare.answer import answer, preamble
from quantroll.compare.bylength import by_length_tables
from quantroll.compare.cells import Table
from quantroll.compare.tables import build_tables, plots_after


def md_text(text) -> str:
    """One line of literal text: '|' would end a cell and '<' could open raw HTML (an error message)."""
    return str(text).replace("|", "\\|").replace("<", "\\<").replace("\n", " ")


def table_md(t: Table) -> list[str]:
    out = [f"## {t.title}", ""]
    if t.rows:
        out.append("| " + " | ".join(md_text(h) for h in t.headers) + " |")
        out.append("|" + "---|" * len(t.headers))
        out += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in t.rows]
    else:
        out.append("_no data_")
    if t.legend:
        out += ["", *[f"- `{k}`: {md_text(v)}" for k, v in t.legend]]
    if t.notes:
        out += ["", *[f"- {md_text(n)}" for n in t.notes]]
    return out + [""]


def render_markdown(summary: dict, plots: dict) -> str:
    """The whole report; ``plots`` maps plot file names (under plots/) to paths that exist."""
    out = ["# quantroll compare: low-precision rollout study", ""]
    out += [f"- {md_text(line)}" for line in answer(summary)] + [""]
    out += [f"- {md_text(line)}" for line in preamble(summary)] + [""]
    tables = build_tables(summary) + by_length_tables(summary)  # per group, by length bucket
    after = plots_after(tables)
    for t in tables:
        out += table_md(t)
        for name in after.get(t.key, ()):
            if name in plots:
                out += [f"![{name[:-4].replace('_', ' ')}](plots/{name})", ""]
    return "\n".join(out)

"""The flag tables of docs/, generated from the parsers so that they cannot drift from ``--help``.

A docs page holds a command's flags between two markers::

    <!-- flags: train -->            every group of `quantroll train` not claimed by another block
    <!-- flags: train | placement --> only the groups whose title starts with "placement"
    ...
    <!-- /flags -->

``tests/test_docs_flags.py`` checks that every flag of every subcommand's ``--help`` is in
exactly one such block. To refresh the tables after a parser changed (new flag, new help
text), run ``PYTHONPATH=$PWD python -m tests.docs_flags`` at the repository root: it rewrites
the text between the markers and nothing else.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from quantroll.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- flags: (?P<cmd>[\w ]+?)(?: \| (?P<group>[^>]+?))? -->\n(?P<body>.*?)<!-- /flags -->", re.S)
ROW_FLAG = re.compile(r"^\| `([^`]+)`")


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand that takes flags, by its name after ``quantroll`` ("train", "bench rollout")."""
    out, todo = {}, [("", build_parser())]
    while todo:
        name, parser = todo.pop()
        if name and flags_of(parser):
            out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {n}".strip(), p) for n, p in action.choices.items()]
    return out


def _shown(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction) \
        and not isinstance(action, argparse._SubParsersAction)


def _label(action: argparse.Action) -> str:
    """The flag as the table names it: ``--skip PATTERN``, a switch bare, a positional by metavar."""
    if not action.option_strings:
        return action.metavar or action.dest.upper()
    name = max(action.option_strings, key=len)
    if action.nargs == 0:
        return name
    if action.choices is not None and action.metavar is None:
        return f"{name} {{{','.join(map(str, action.choices))}}}"
    return f"{name} {action.metavar or action.dest.upper()}"


def flags_of(parser: argparse.ArgumentParser) -> list[str]:
    """The names ``--help`` lists for a parser (help itself excluded)."""
    return [_label(a) for a in parser._actions if _shown(a)]


def _groups(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if _shown(a)]
        if actions:
            out.append((group.title or "", actions))
    return out


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    return " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")


def render(cmd: str, only: str | None, claimed: list[str]) -> str:
    """The table of ``quantroll cmd``'s flags: groups starting with ``only``, else all not ``claimed``."""
    parser = commands()[cmd]
    groups = _groups(parser)
    if only is not None:
        groups = [(t, a) for t, a in groups if t.startswith(only)]
    else:
        groups = [(t, a) for t, a in groups if not any(t.startswith(c) for c in claimed)]
    rows = ["| flag | what it does (from `--help`) |", "| --- | --- |"]
    for title, actions in groups:
        if len(groups) > 1 or only is not None:
            rows.append(f"| **{title}** | |")
        rows += [f"| `{_label(a)}` | {_help(parser, a)} |" for a in actions]
    return "\n".join(rows) + "\n"


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def documented(text: str) -> list[tuple[str, str]]:
    """(command, flag) for every flag row of every block of a page."""
    return [(m["cmd"], f.group(1)) for m in blocks(text)
            for line in m["body"].splitlines() if (f := ROW_FLAG.match(line))]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def rewrite(text: str, claims: dict[str, list[str]]) -> str:
    def one(m: re.Match) -> str:
        head = m.group(0).split("\n", 1)[0]
        return f"{head}\n{render(m['cmd'], m['group'], claims.get(m['cmd'], []))}<!-- /flags -->"
    return BLOCK.sub(one, text)


def claims_of(texts) -> dict[str, list[str]]:
    """Per command, the group prefixes that blocks of their own take (the plain block gets the rest)."""
    claims: dict[str, list[str]] = {}
    for text in texts:
        for m in blocks(text):
            if m["group"]:
                claims.setdefault(m["cmd"], []).append(m["group"])
    return claims


def stale() -> list[str]:
    """The pages whose tables differ from what the parsers generate now."""
    texts = {p: p.read_text(encoding="utf-8") for p in pages()}
    claims = claims_of(texts.values())
    return [str(p.relative_to(ROOT)) for p, text in texts.items() if rewrite(text, claims) != text]


def main() -> None:
    texts = {p: p.read_text(encoding="utf-8") for p in pages()}
    claims = claims_of(texts.values())
    for path, text in texts.items():
        new = rewrite(text, claims)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote the flag tables of {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

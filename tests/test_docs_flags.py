"""Every flag of every subcommand's ``--help`` is documented in exactly one docs page.

The tables live between ``<!-- flags: CMD -->`` markers and are generated from the parsers
(``tests/docs_flags.py``; refresh with ``PYTHONPATH=$PWD python -m tests.docs_flags``), so a flag
added, renamed or removed without its docs fails here.
"""

from collections import Counter

from tests import docs_flags


def _documented() -> Counter:
    return Counter(row for page in docs_flags.pages() for row in docs_flags.documented(page.read_text(encoding="utf-8")))


def test_every_flag_is_documented_exactly_once():
    seen = _documented()
    expected = Counter((cmd, flag) for cmd, p in docs_flags.commands().items() for flag in docs_flags.flags_of(p))
    missing = sorted(expected - seen)
    extra = sorted(seen - expected)
    twice = sorted(k for k, n in seen.items() if n > 1)
    hint = " (refresh the tables: PYTHONPATH=$PWD python -m tests.docs_flags)"
    assert not missing, f"flags of --help missing from docs/: {missing}{hint}"
    assert not extra, f"docs/ lists flags that --help does not: {extra}{hint}"
    assert not twice, f"flags documented in more than one place: {twice}"


def test_every_command_has_a_table_and_blocks_name_real_commands():
    cmds = docs_flags.commands()
    named = {m["cmd"] for page in docs_flags.pages() for m in docs_flags.blocks(page.read_text(encoding="utf-8"))}
    assert named <= set(cmds), named - set(cmds)
    assert set(cmds) <= named, set(cmds) - named


def test_the_checker_sees_a_missing_and_a_doubled_flag():
    table = docs_flags.render("inspect", None, [])
    page = f"<!-- flags: inspect -->\n{table}<!-- /flags -->\n"
    rows = docs_flags.documented(page)
    assert ("inspect", "--top N") in rows and ("inspect", "DIR") in rows
    dropped = page.replace("| `--top N` |", "| --top N |")
    assert ("inspect", "--top N") not in docs_flags.documented(dropped)
    assert Counter(docs_flags.documented(page + page))[("inspect", "--top N")] == 2


def test_the_tables_say_what_help_says_now():
    assert docs_flags.stale() == [], (
        "a flag's help text or default changed without its docs table: run "
        "PYTHONPATH=$PWD python -m tests.docs_flags and commit the rewritten pages")

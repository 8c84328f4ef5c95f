"""The front door and the map stay true: README.md is short and keeps CI's two commands,
its pictures exist, and docs/ARCHITECTURE.md's package table lists exactly the folders of
``quantroll/``."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_README_LINES = 220
ROW = re.compile(r"^\| (?P<first>[^|]+) \|")
PACKAGE = re.compile(r"`(\w+)/`")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")


def table_packages(text: str) -> list[str]:
    """Package names (``formats/`` -> "formats") in the first column of the "## Packages" table."""
    section = text.split("## Packages", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        m = ROW.match(line)
        if m and not set(m["first"].strip()) <= set("- "):
            out += PACKAGE.findall(m["first"])
    return out


def folders() -> set[str]:
    return {p.name for p in (ROOT / "quantroll").iterdir()
            if p.is_dir() and not p.name.startswith(("_", "."))}


def test_architecture_package_table_matches_the_folders():
    listed = table_packages((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    doubled = sorted({n for n in listed if listed.count(n) > 1})
    assert not doubled, f"docs/ARCHITECTURE.md lists these packages twice: {doubled}"
    assert set(listed) == folders(), (
        f"docs/ARCHITECTURE.md's package table is out of date: not in the table {sorted(folders() - set(listed))}, "
        f"no such folder {sorted(set(listed) - folders())}")


def test_the_table_reader_sees_a_package_row():
    text = "## Packages\n\n| package | owns |\n| --- | --- |\n| `a/` | x |\n| `b/`, `c.py` | y |\n\n## Next\n| `d/` | z |\n"
    assert table_packages(text) == ["a", "b"]


def test_readme_is_a_front_door_with_ci_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    for marker in ("<!-- main-command -->", "<!-- test-command -->"):
        i = lines.index(marker)
        assert lines[i + 1] == "```" and lines[i + 2].startswith("pip install torch=="), marker
    assert lines.index("<!-- main-command -->") < 60, "the set-up commands belong on the first screen"


def test_pictures_in_docs_exist():
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for ref in IMAGE.findall(page.read_text(encoding="utf-8")):
            assert (page.parent / ref).is_file(), f"{page.relative_to(ROOT)}: no picture {ref}"

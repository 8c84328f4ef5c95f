"""Every repository document a source file or a doc cites exists, and docs/PERFORMANCE.md
stays a reference of current figures (at most 320 lines), not a log.

A citation is a path ending in ``.md``: with a directory (``docs/X.md``) it must exist
relative to the repository root or to the citing file; a bare name (``README.md``) must
exist at the root or under docs/. Names of files quantroll writes (``report.md``) and
paths under directories that are not in the repository (``quantroll-compare/...``) are
outputs, not citations. ``DESIGN``, the design notes kept outside the repository, must
not be cited at all.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("quantroll", "tests", "bench")
SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".sh")
# written by compare / attribute, not repository documents; findings.md: the long-study report's own
# conclusions, a name beside whichever report folder it belongs to
OUTPUT_NAMES = {"report.md", "findings.md"}
MAX_PERFORMANCE_LINES = 320

CITATION = re.compile(r"(?<![\w./-])((?:\.{1,2}/)?(?:[\w.-]+/)*[\w-]+\.md)\b")
DESIGN = re.compile(r"\bDESIGN\b")


def _sources() -> list[Path]:
    files = [p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()]
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _missing(ref: str, citing: Path) -> bool:
    """True when ``ref`` names a repository document that does not exist."""
    name = ref.rsplit("/", 1)[-1]
    if "/" not in ref:
        if name in OUTPUT_NAMES:
            return False
        return not ((ROOT / name).is_file() or (ROOT / "docs" / name).is_file())
    for base in (ROOT, citing.parent):
        if (base / ref).is_file():
            return False
    first = ref.split("/", 1)[0]
    if first in ("..", "."):
        return True  # outside the repository, or relative to the file and absent
    return (ROOT / first).is_dir() or (citing.parent / first).is_dir()  # else an output path


def _broken(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for ref in CITATION.findall(line):
                if _missing(ref, path):
                    out.append(f"{path.relative_to(ROOT)}:{i}: {ref}")
    return out


def test_sources_cite_only_existing_documents():
    assert _broken(_sources()) == []


def test_docs_link_only_existing_documents():
    assert _broken(_docs()) == []


def test_no_source_cites_the_design_notes_outside_the_repository():
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in _sources()
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if DESIGN.search(line)]
    assert hits == [], "cite docs/ARCHITECTURE.md or the README instead of DESIGN: " + ", ".join(hits)


def test_the_checker_sees_a_missing_document():
    citing = ROOT / "quantroll" / "x.py"
    assert _missing("docs/NO_SUCH_DOC.md", citing)
    assert _missing("NO_SUCH_DOC.md", citing)
    assert not _missing("docs/PERFORMANCE.md", citing)
    assert not _missing("README.md", citing)
    assert not _missing("report.md", citing)
    assert not _missing("quantroll-compare/report.md", citing)


def test_performance_is_a_reference_not_a_log():
    lines = (ROOT / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_PERFORMANCE_LINES, (
        f"docs/PERFORMANCE.md has {len(lines)} lines (at most {MAX_PERFORMANCE_LINES}): keep current figures, "
        "move what was tried to docs/history.md")

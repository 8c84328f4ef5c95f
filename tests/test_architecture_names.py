"""Checkable extensibility: outside quantroll/model/families/ (the family modules and the
registry) no file of the package names an architecture family, and no code branches on a
``model_type`` or ``architectures`` value. A new family is then one module there plus its
tests (docs/ARCHITECTURE.md, "Adding a model family").

The names checked are the issue's ``grep -ril 'llama\\|qwen2' quantroll/``; "qwen3" stays
allowed where it is data (the built-in tiny Qwen3 and the benchmark shapes), which is why
the second test looks at comparisons rather than at strings."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "quantroll"
FAMILIES = ROOT / "model" / "families"
NAMES = re.compile(r"llama|qwen2", re.IGNORECASE)


def _files():
    for path in sorted(ROOT.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


def test_only_the_family_modules_and_registry_name_an_architecture():
    named = [str(p.relative_to(ROOT.parent)) for p in _files()
             if FAMILIES not in p.parents and NAMES.search(p.read_text(errors="replace"))]
    assert not named, f"files outside {FAMILIES.relative_to(ROOT.parent)}/ that name a family: {named}"


def test_the_grep_finds_the_families_themselves():
    """The check above can fail: the family modules do match it."""
    hits = {p.name for p in _files() if NAMES.search(p.read_text(errors="replace"))}
    assert {"llama.py", "qwen2.py", "registry.py"} <= hits


def _names_model_type(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return "model_type" in text or "architectures" in text


def test_no_code_outside_the_registry_branches_on_a_model_type():
    """``x.model_type == "..."``, ``cfg.get("model_type") in (...)``: a comparison of a model
    type or architecture with a string constant belongs in a family's data."""
    found = []
    for path in ROOT.rglob("*.py"):
        if FAMILIES in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            constants = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)
                         or isinstance(s, (ast.Tuple, ast.List, ast.Set))
                         and any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in s.elts)]
            if constants and any(_names_model_type(s) for s in sides if s not in constants):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "branches on a family name outside model/families/:\n" + "\n".join(found)

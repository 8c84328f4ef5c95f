"""What the safety tests share: a tiny model, a saved run to damage, and the check that
a refused command printed one line, no traceback, and changed nothing on disk."""

from __future__ import annotations

import os
from pathlib import Path

from quantroll.builtin import TinyQwen3, write_tiny_qwen3
from quantroll.cli import main

TINY = TinyQwen3(num_hidden_layers=1)
FAST = ["--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "3", "--device", "cpu"]


def write_model(path: Path) -> Path:
    return write_tiny_qwen3(path, TINY)


def train_args(model: Path, *extra: str) -> list[str]:
    return ["train", "--hf-checkpoint", str(model), *FAST, *extra]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, and a file's size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            is_dir = p.is_dir()  # a directory's mtime changes when an entry comes and goes: not compared
            out[str(p.relative_to(root))] = (is_dir, 0 if is_dir else st.st_size, 0 if is_dir else st.st_mtime_ns)
    return out


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_refused(rc: int, out: str, err: str, match: str, command: str, code: int = 2) -> str:
    """Exit ``code``, exactly one line on stderr naming the problem, no traceback."""
    lines = err.strip().splitlines()
    assert rc == code, (rc, out[-2000:], err[-2000:])
    assert len(lines) == 1, err
    assert lines[0].startswith(f"quantroll {command}: error: "), lines[0]
    assert match in lines[0], (match, lines[0])
    assert "Traceback" not in out + err
    return lines[0]

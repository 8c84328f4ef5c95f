"""Running checks under Triton's CPU interpreter. TRITON_INTERPRET=1 must be set before
triton is imported, so those checks run in a subprocess (usually the test module itself,
run as a script), with CUDA hidden so that every tensor stays on the CPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _triton_before_3_8() -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    from importlib.metadata import version

    return tuple(int(p) for p in version("triton").split(".")[:2]) < (3, 8)


# Triton 3.6's interpreter (the device's version) fails on a 0-d array conversion in
# loops over runtime bounds (the paged attention kernels' key loops); 3.8's runs them.
needs_new_interpreter = pytest.mark.skipif(_triton_before_3_8(),
                                           reason="Triton < 3.8: its interpreter cannot run this kernel's loops")


def run_interpreted(argv: list[str], ok_line: str, timeout: int = 300) -> None:
    """``python *argv`` from the repository root under the interpreter: it must exit 0 and
    print ``ok_line`` (so a script that skipped its checks cannot pass)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # `tests` importable
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert ok_line in out.stdout, out.stdout[-3000:]

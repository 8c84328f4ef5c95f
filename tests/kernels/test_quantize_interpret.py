"""The quantize kernels under Triton's CPU interpreter (only where triton is importable and
no GPU is present; the GPU tests check the same kernels bit for bit)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU present: test_quantize_gpu.py checks the bits")
def test_kernels_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "tests.kernels.interpret_check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "cases ok" in out.stdout

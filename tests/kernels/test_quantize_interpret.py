"""The quantize kernels under Triton's CPU interpreter (only where triton is importable and
no GPU is present; the GPU tests check the same kernels bit for bit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.interpreted import needs_triton, run_interpreted

ROOT = Path(__file__).resolve().parents[2]


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU present: test_quantize_gpu.py checks the bits")
def test_kernels_under_interpreter():
    run_interpreted(["-m", "tests.kernels.interpret_check"], "cases ok", timeout=600)

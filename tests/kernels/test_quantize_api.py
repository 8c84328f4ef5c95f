"""The GPU quantize API on a CPU machine: imports without triton, lays out outputs as the
reference does, and refuses bad input before any kernel is compiled."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from quantroll.errors import QuantrollError
from quantroll.kernels import allocate_quantized, output_layout, quantize_weight_gpu, quantize_weights_gpu
from tests.kernels.cases import FORMAT_IDS, FORMATS, fmt_of


def test_package_imports_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # any 'import triton' now fails
        "import quantroll, quantroll.kernels as k\n"
        "assert not k.triton_available()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("shape", [(1, 1), (127, 129), (200, 300), (256, 31), (33, 17)], ids=str)
def test_layout_matches_reference(spec, shape):
    fmt = fmt_of(spec)
    ref = fmt.quantize_weight(torch.randn(shape))
    lay = output_layout(shape, fmt)
    assert lay["data"] == (tuple(ref.data.shape), ref.data.dtype)
    assert lay["scale"] == (tuple(ref.scale.shape), ref.scale.dtype)
    if ref.global_scale is None:
        assert lay["global_scale"] is None
    else:
        assert lay["global_scale"] == (tuple(ref.global_scale.shape), ref.global_scale.dtype)
    q = allocate_quantized(shape, fmt, "cpu")
    assert (q.format, q.shape, q.block) == (ref.format, ref.shape, ref.block)
    assert (q.data.shape, q.data.dtype, q.scale.shape, q.scale.dtype) == (ref.data.shape, ref.data.dtype, ref.scale.shape, ref.scale.dtype)


def test_cpu_tensor_refused_outside_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(QuantrollError, match="needs a CUDA tensor"):
        quantize_weight_gpu(torch.randn(4, 4), "fp8", "w")


@pytest.mark.parametrize(
    "w, match",
    [
        (torch.randn(4, 4, dtype=torch.float64), "dtype torch.float64"),
        (torch.randn(2, 4, 4), "must be 2-D"),
        (torch.randn(0, 4), "no elements"),
        (torch.randint(0, 3, (4, 4)), "dtype torch.int64"),
    ],
)
def test_bad_input_refused(monkeypatch, w, match):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # let CPU tensors through to the checks
    with pytest.raises(QuantrollError, match=match):
        quantize_weight_gpu(w, "fp8", "w")


def test_bad_out_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    w = torch.randn(200, 300)
    wrong_shape = allocate_quantized((200, 301), "mxfp8", "cpu")
    with pytest.raises(QuantrollError, match="out= data for 'w' has shape"):
        quantize_weight_gpu(w, "mxfp8", "w", out=wrong_shape)
    q = allocate_quantized((200, 300), "nvfp4", "cpu")
    no_global = type(q)(q.data, q.scale, q.format, q.shape, q.block, None)
    with pytest.raises(QuantrollError, match="lacks its global_scale"):
        quantize_weight_gpu(w, "nvfp4", "w", out=no_global)
    q = allocate_quantized((200, 300), "fp8", "cpu")
    wrong_dtype = type(q)(q.data, q.scale.to(torch.float64), q.format, q.shape, q.block)
    with pytest.raises(QuantrollError, match="dtype torch.float64, expected torch.float32"):
        quantize_weight_gpu(w, "fp8", "w", out=wrong_dtype)


def test_list_lengths_must_agree(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(QuantrollError, match="2 weights but 1 names"):
        quantize_weights_gpu([torch.randn(4, 4), torch.randn(4, 4)], "fp8", ["a"])
    assert quantize_weights_gpu([], "fp8") == []


@pytest.mark.parametrize("sizes,parts", [([5], 4), ([1, 1, 1, 1], 4), ([10, 1, 1, 1, 1], 4), ([3] * 7, 4),
                                         ([2, 8, 2, 8, 2, 8], 3), ([4, 4], 1), (list(range(1, 200)), 4)])
def test_plan_branches_cut_the_list_into_balanced_contiguous_chunks(sizes, parts):
    """QuantizePlan's parallel branches: every weight in exactly one chunk, in order, no
    chunk empty, at most ``parts`` chunks, and no chunk heavier than an equal share plus
    its own largest weight (a greedy cut can overshoot by one weight, never more)."""
    from quantroll.kernels.quantize import _balanced_chunks

    chunks = _balanced_chunks(sizes, parts)
    assert chunks[0][0] == 0 and chunks[-1][1] == len(sizes)
    assert all(a < b for a, b in chunks) and all(b == c for (_, b), (c, _) in zip(chunks, chunks[1:]))
    assert len(chunks) == min(parts, len(sizes))
    share = sum(sizes) / len(chunks)
    assert all(sum(sizes[a:b]) <= share + max(sizes[a:b]) for a, b in chunks)

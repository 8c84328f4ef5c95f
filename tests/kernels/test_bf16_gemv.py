"""The BF16 twin of the CUDA decode GEMM (bf16_gemv_* in kernels/cuda/fp8_gemv.cu; off by
default, fp8_gemv.BF16_MAX_M = 0): its variants, when QLinear takes it, and on a GPU its
outputs against float64 (half a BF16 ulp plus float32-summation slack), run to run and
under graph replay, and QLinear's forward with it on."""

import re

import pytest
import torch

from quantroll.kernels import cuda_jit, fp8_gemv


def test_bf16_variants_match_the_instances_in_the_source():
    source = (cuda_jit.SOURCE_DIR / fp8_gemv.SOURCE).read_text()
    found = re.findall(r"^QUANTROLL_BF16_GEMV\((\d+), (\d+), (\d+), (\d+), (\d+)\)", source, re.M)
    assert {tuple(map(int, m)) for m in found} == {(c.token_tiles, c.row_tiles, c.warps, c.unroll, c.pipeline)
                                                   for c in fp8_gemv.BF16_VARIANTS}
    for choice in fp8_gemv.BF16_CHOICE.values():
        assert fp8_gemv.GemvConfig(*choice) in fp8_gemv.BF16_VARIANTS
        assert fp8_gemv.GemvConfig(*choice[:1], 1, *choice[2:]) in fp8_gemv.BF16_VARIANTS


def test_qlinear_keeps_f_linear_when_off_or_training(monkeypatch):
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    assert fp8_gemv.bf16_decode_linear(x, w, None) is None  # off by default
    monkeypatch.setattr(fp8_gemv, "BF16_MAX_M", 16)
    assert fp8_gemv.bf16_decode_linear(x, w, torch.zeros(32, dtype=torch.bfloat16)) is None  # a bias
    with torch.enable_grad():
        assert fp8_gemv.bf16_decode_linear(x, w, None) is None  # autograd needs F.linear
    with torch.no_grad():
        assert fp8_gemv.bf16_decode_linear(x, w, None) is None  # CPU tensors
        assert fp8_gemv.bf16_decode_linear(torch.randn(17, 64, dtype=torch.bfloat16), w, None) is None


gpu = pytest.mark.skipif(not torch.cuda.is_available() or cuda_jit.unavailable_reason() is not None,
                         reason="needs a CUDA GPU with FP8 conversions and nvcc")


def _excess(x, w, y) -> float:
    from tests.engine.test_bf16_decode import excess_over_bf16_rounding

    return excess_over_bf16_rounding(y, x.double(), w.double())


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 16, 64), (5, 48, 192), (9, 96, 1152), (16, 4096, 4096), (16, 4096, 12288)])
def test_every_bf16_variant_rounds_the_float64_result(m, n, k):
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = (torch.randn(m, k, device="cuda", generator=g) * torch.logspace(-2, 2, k, device="cuda")).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    for cfg in fp8_gemv.BF16_VARIANTS:
        if 8 * cfg.token_tiles < m or n % cfg.rows:
            continue
        y = fp8_gemv.bf16_gemv(x, w, cfg)
        assert _excess(x, w, y) <= 0, cfg
        assert torch.equal(y, fp8_gemv.bf16_gemv(x, w, cfg, early=False)), cfg
        out = torch.empty_like(y)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fp8_gemv.bf16_gemv(x, w, cfg, out=out)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y), cfg


@gpu
@pytest.mark.gpu
def test_qlinear_forward_takes_it_when_on(monkeypatch):
    from quantroll.model.linear import QLinear

    layer = QLinear(4096, 1024).to("cuda", torch.bfloat16)
    torch.nn.init.normal_(layer.weight, std=0.02)
    x = torch.randn(2, 3, 4096, device="cuda", dtype=torch.bfloat16)
    calls = []
    real = fp8_gemv.bf16_gemv
    monkeypatch.setattr(fp8_gemv, "bf16_gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(fp8_gemv, "BF16_MAX_M", 16)
    with torch.no_grad():
        y = layer(x)
    assert calls and y.shape == (2, 3, 1024)
    assert _excess(x.reshape(6, 4096), layer.weight, y.reshape(6, 1024)) <= 0

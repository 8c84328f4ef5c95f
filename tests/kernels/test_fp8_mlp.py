"""The two-kernel FP8 decode MLP (kernels/cuda/fp8_mlp.cu): its variants and choice on any
machine; on a GPU, its bits against the unfused path (fp8_gemv gate_up, the silu * up
kernel quantizing, fp8_gemv down), its down GEMM against float64 on the codes it made,
its counters left zero, CUDA-graph replay, and the engine's generations with it on."""

import re
from types import SimpleNamespace

import pytest
import torch

from quantroll.kernels import cuda_jit, fp8_gemv, fp8_mlp

EIGHT_B = (4096, 12288)  # hidden, intermediate


def test_variant_lists_match_the_instances_in_the_source():
    source = (cuda_jit.SOURCE_DIR / fp8_mlp.SOURCE).read_text()
    for macro, variants in (("QUANTROLL_FP8_GATE_UP_SILU", fp8_mlp.GATE_UP_VARIANTS),
                            ("QUANTROLL_FP8_DOWN_AFTER_FLAGS", fp8_mlp.DOWN_VARIANTS)):
        found = re.findall(rf"^{macro}\((\d+), (\d+), (\d+), (\d+), (\d+)\)", source, re.M)
        assert sorted(tuple(map(int, f)) for f in found) == sorted(
            (c.token_tiles, c.row_tiles, c.warps, c.unroll, c.pipeline) for c in variants)


@pytest.mark.parametrize("hidden,inter", [EIGHT_B, (2048, 6144), (5120, 17408), (256, 384)])
def test_the_kernels_take_the_unfused_gemms_variants(hidden, inter):
    """Same warps as fp8_gemv's choice for each GEMM: the same K order, hence the same bits
    (checked on the GPU below); every decode batch of the CUDA GEMM has a variant."""
    for m in range(1, fp8_gemv.MAX_M + 1):
        cfg = fp8_mlp.default_config(m, hidden, inter)
        assert cfg is not None, (m, hidden, inter)
        assert cfg.gate_up == fp8_gemv.default_config(m, 2 * inter, hidden)
        assert cfg.down == fp8_gemv.default_config(m, hidden, inter)
        assert 128 % cfg.columns == 0 and hidden % cfg.down.rows == 0 and m <= 8 * cfg.gate_up.token_tiles


def test_shapes_outside_whole_groups_or_batches_are_refused():
    assert fp8_mlp.supports_shape(16, 4096, 12288)
    assert not fp8_mlp.supports_shape(fp8_gemv.MAX_M + 1, 4096, 12288)
    assert not fp8_mlp.supports_shape(4, 4096, 12288 + 64)
    assert not fp8_mlp.supports_shape(4, 4000, 12288)
    assert not fp8_mlp.supports_shape(0, 4096, 12288)


def _layer(weight, backend="fp8", fmt="fp8", bias=None):
    return SimpleNamespace(weight=weight, backend=backend, format=SimpleNamespace(name=fmt), bias=bias)


def test_not_taken_when_off_or_on_cpu(monkeypatch):
    aq = torch.zeros(4, 256, dtype=torch.uint8)
    gu, down = _layer(torch.zeros(768, 256, dtype=torch.uint8)), _layer(torch.zeros(256, 384, dtype=torch.uint8))
    monkeypatch.setattr(fp8_mlp, "ENABLED", True)
    assert not fp8_mlp.takes(aq, gu, down)  # CPU tensors
    monkeypatch.setattr(fp8_mlp, "ENABLED", False)
    assert not fp8_mlp.takes(aq, gu, down)


gpu = pytest.mark.skipif(not torch.cuda.is_available() or cuda_jit.unavailable_reason() is not None,
                         reason="needs a CUDA GPU with FP8 conversions and nvcc")


def _mlp_operands(m, hidden, inter, seed=0):
    from quantroll.formats import get_format
    from quantroll.kernels.fp8_linear import quantize_activation_fp8

    fp8 = get_format("fp8")
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, hidden, device="cuda", generator=g).to(torch.bfloat16)
    gu = (torch.randn(2 * inter, hidden, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    down = (torch.randn(hidden, inter, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    aq, a_s = quantize_activation_fp8(x)
    return aq, a_s, fp8.quantize_weight(gu), fp8.quantize_weight(down)


def _unfused(aq, a_s, gu, down):
    """gate_up GEMM, silu * up quantized by its kernel, down GEMM: (y, down's codes, scales)."""
    from quantroll.kernels import fused

    gate_up = fp8_gemv.fp8_gemv(aq, a_s, gu.data, gu.scale, early=False)
    act = fused.silu_mul(gate_up, quantize=True)
    return fp8_gemv.fp8_gemv(act.codes, act.scales, down.data, down.scale, early=False), act.codes, act.scales


def _fused_with_input(monkeypatch, *args, **kwargs):
    """fp8_mlp.fp8_mlp's output and the down-input codes and scales it made."""
    made = []
    real = fp8_mlp.fp8_activation_buffers
    monkeypatch.setattr(fp8_mlp, "fp8_activation_buffers", lambda *a: made.append(real(*a)) or made[-1])
    y = fp8_mlp.fp8_mlp(*args, **kwargs)
    torch.cuda.synchronize()
    return y, *made[-1]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m,hidden,inter", [(1, 128, 128), (5, 256, 384), (8, 256, 384), (9, 384, 256),
                                            (16, 256, 384), (1, *EIGHT_B), (13, *EIGHT_B), (16, *EIGHT_B)])
def test_same_bits_as_the_unfused_path_and_down_rounds_float64(m, hidden, inter, monkeypatch):
    from quantroll.formats import get_format
    from tests.numerics import excess_over_bf16_rounding

    aq, a_s, gu, down = _mlp_operands(m, hidden, inter)
    y, q, s = _fused_with_input(monkeypatch, aq, a_s, gu.data, gu.scale, down.data, down.scale)
    y_ref, q_ref, s_ref = _unfused(aq, a_s, gu, down)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    assert torch.equal(y, y_ref)
    h = q.double() * s.double().repeat_interleave(128, dim=1)
    assert excess_over_bf16_rounding(y, h, get_format("fp8").dequantize(down).double()) <= 0
    # plainly launched: the same bits, and the counters are back to zero after every launch
    assert torch.equal(y, fp8_mlp.fp8_mlp(aq, a_s, gu.data, gu.scale, down.data, down.scale, early=False))
    flags = fp8_mlp.counters(fp8_mlp.COUNTERS, "cuda", fp8_mlp.MIN_COUNTERS)
    assert int(flags.abs().sum()) == 0


@gpu
@pytest.mark.gpu
def test_every_variant_pair_gives_the_bits_of_its_gemms():
    """The sweep's variants (other warps than the choice): bits of fp8_gemv with the same
    variants, at 16 rows on the 8B shapes."""
    aq, a_s, gu, down = _mlp_operands(16, *EIGHT_B, seed=3)
    from quantroll.kernels import fused

    for gcfg in fp8_mlp.GATE_UP_VARIANTS:
        for dcfg in fp8_mlp.DOWN_VARIANTS:
            if min(gcfg.token_tiles, dcfg.token_tiles) < 2:
                continue
            cfg = fp8_mlp.MlpConfig(gcfg, dcfg)
            y = fp8_mlp.fp8_mlp(aq, a_s, gu.data, gu.scale, down.data, down.scale, cfg)
            gate_up = fp8_gemv.fp8_gemv(aq, a_s, gu.data, gu.scale, gcfg, early=False)
            act = fused.silu_mul(gate_up, quantize=True)
            assert torch.equal(y, fp8_gemv.fp8_gemv(act.codes, act.scales, down.data, down.scale, dcfg, early=False)), cfg


@gpu
@pytest.mark.gpu
def test_graph_replay_reads_the_new_input():
    """Captured right after the kernel that writes its input and replayed on new inputs:
    the eager result every time (the gate/up kernel waits for the writer; the down kernel
    for each group's flag; the counters reset between replays)."""
    aq, a_s, gu, down = _mlp_operands(16, 512, 1024)
    src = aq.clone()
    out = torch.empty(16, 512, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        aq.copy_(src)
        out.copy_(fp8_mlp.fp8_mlp(aq, a_s, gu.data, gu.scale, down.data, down.scale))
    for seed in range(3):
        fresh = _mlp_operands(16, 512, 1024, seed=seed + 1)[0]
        src.copy_(fresh)
        aq.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fp8_mlp.fp8_mlp(fresh, a_s, gu.data, gu.scale, down.data, down.scale, early=False))


@gpu
@pytest.mark.gpu
def test_engine_generations_are_the_same_with_the_fused_mlp():
    """The FP8 engine (CUDA graphs, 3 prompts, decode batch 3) with the two-kernel MLP on:
    the same tokens and logprobs, bit for bit, as with it off, and the kernels ran."""
    pytest.importorskip("triton")
    from tests.engine.switches import assert_same_generations, counting, engine_results_by_switch

    with counting(fp8_mlp, "fp8_mlp") as calls:
        results = engine_results_by_switch("fp8_mlp", "ENABLED")
    assert calls[0] > 0
    assert_same_generations(results[False], results[True])

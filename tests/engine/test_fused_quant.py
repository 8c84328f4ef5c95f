"""Producers that hand a block-FP8 linear its input already quantized (Fp8Activation):
the fused RMSNorm and silu*up kernels must store bit for bit the codes and scales that
the linear's own launch (act_quant_fp8_kernel) and the reference (formats) make of their
BF16 output, and a model must give the same bits with the fusion on or off.

CPU: the checks below run under Triton's interpreter in a subprocess (this file run as
a script), on CPU tensors. GPU: the same kernel checks on CUDA, and an FP8 engine with
and without the fusion (eager and CUDA graphs)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from tests.interpreted import needs_triton, run_interpreted

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None
GPU = torch.cuda.is_available() and HAS_TRITON


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).cpu()


def _codes_match_reference(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """Bitwise, except under the interpreter, whose own float32 -> e4m3 cast is inexact
    (tests/kernels/interpret_check.py): there the kernels agree with act_quant_fp8_kernel
    bit for bit (same cast) and with the reference up to that cast's slips."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return torch.equal(_u8(got), _u8(ref))
    from tests.kernels.interpret_check import e4m3_close

    return e4m3_close(ref.cpu(), got.cpu())


def check_quantized_output(act, y: torch.Tensor) -> None:
    """``act`` (an Fp8Activation from a fused kernel) against the BF16 output ``y`` of the
    same kernel without quantization."""
    from quantroll.formats import get_format
    from quantroll.kernels.fp8_linear import quantize_activation_fp8

    y2 = y.reshape(-1, y.shape[-1])
    assert act.shape == y.shape and act.dtype == y.dtype
    assert act.codes.shape == y2.shape and act.codes.dtype == torch.float8_e4m3fn
    assert act.scales.shape == (y2.shape[0], y2.shape[1] // 128) and act.scales.stride() == (1, y2.shape[0])
    codes, scales = quantize_activation_fp8(y2)  # the launch the fusion saves
    assert torch.equal(_u8(act.codes), _u8(codes)), "codes differ from act_quant_fp8_kernel's"
    assert torch.equal(act.scales.cpu().view(torch.int32), scales.cpu().view(torch.int32)), "scales vs act_quant"
    ref = get_format("fp8").quantize_activation(y2.cpu())
    assert torch.equal(act.scales.cpu().view(torch.int32), ref.scale.view(torch.int32)), "scales vs the reference"
    assert _codes_match_reference(act.codes, ref.data), "codes vs the reference"


def _activation(shape, device, seed: int) -> torch.Tensor:
    """Values over six decades along the row, and one all-zero group (scale 0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[-1])
    x.reshape(-1, shape[-1])[0, :128] = 0
    return x.to(torch.bfloat16).to(device)


def check_add_rmsnorm(device: str, hidden: int, shape: tuple[int, ...], with_delta: bool) -> None:
    from quantroll.kernels.fused import add_rmsnorm

    x = _activation((*shape, hidden), device, hidden)
    delta = _activation((*shape, hidden), device, hidden + 1) if with_delta else None
    g = torch.Generator().manual_seed(7)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).to(device)
    res, y = add_rmsnorm(x, delta, weight, 1e-6)
    res_q, act = add_rmsnorm(x, delta, weight, 1e-6, quantize=True)
    assert torch.equal(res_q, res) and act.source is None
    check_quantized_output(act, y)
    res_b, both = add_rmsnorm(x, delta, weight, 1e-6, quantize=True, keep_bf16=True)  # a MoE block's input
    assert torch.equal(res_b, res) and torch.equal(both.source.view(torch.int16), y.view(torch.int16))
    check_quantized_output(both, y)


def check_silu_mul(device: str, inter: int, shape: tuple[int, ...]) -> None:
    from quantroll.kernels.fused import silu_mul

    gate_up = _activation((*shape, 2 * inter), device, inter) * 1e-2
    y = silu_mul(gate_up)
    act = silu_mul(gate_up, quantize=True)
    check_quantized_output(act, y)


def check_decode_attention(device: str) -> None:
    """Paged decode attention handing o_proj its input quantized (heads of 128: one group
    each), in one split (the decode kernel's epilogue) and in three (the merge kernel), over
    a BF16 and an FP8 cache; heads of 64 are refused. Interpreted by
    test_paged_attention_interpreted.py (Triton 3.8's interpreter runs the key loops)."""
    import dataclasses

    from quantroll.bench.shapes import shape_config
    from quantroll.engine.paged_cache import AttentionBatch, PagedKVCache
    from quantroll.kernels import paged_attention

    cfg = dataclasses.replace(shape_config("qwen3-8b", 1), num_attention_heads=8, num_key_value_heads=2, head_dim=128)
    contexts = [5, 40, 1]
    g = torch.Generator().manual_seed(3)
    for kv_dtype in ("bf16", "fp8_e4m3"):
        cache = PagedKVCache(cfg, 8, 16, torch.bfloat16, kv_dtype, device, gpu_kernels=False)
        table = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 0, 0]], dtype=torch.int32, device=device)
        slots = [table[i, p // 16].item() * 16 + p % 16 for i, c in enumerate(contexts) for p in range(c)]
        cache.batch = AttentionBatch(torch.tensor(slots, device=device), table,
                                     torch.tensor(contexts, dtype=torch.int32, device=device), None)
        kv = torch.randn(2, len(slots), 2, 128, generator=g).to(torch.bfloat16).to(device)
        cache.write(0, kv[0], kv[1] * torch.logspace(-2, 2, 128).to(torch.bfloat16).to(device))
        q = torch.randn(len(contexts), 8, 128, generator=g).to(torch.bfloat16).to(device)
        for splits in (1, 3):
            tiles = paged_attention.PagedTiles(decode_block_s=16, max_splits=splits)
            y = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits)
            act = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits, quantize=True)
            check_quantized_output(act, y.reshape(len(contexts), 8 * 128))
    small = dataclasses.replace(cfg, head_dim=64)
    cache = PagedKVCache(small, 8, 16, torch.bfloat16, "bf16", device, gpu_kernels=False)
    with pytest.raises(ValueError, match="heads of 128 only"):
        paged_attention.decode_attention(torch.zeros(1, 8, 64, dtype=torch.bfloat16, device=device), cache, 0,
                                         AttentionBatch(torch.zeros(1, dtype=torch.long, device=device),
                                                        torch.ones(1, 1, dtype=torch.int32, device=device),
                                                        torch.ones(1, dtype=torch.int32, device=device), None),
                                         quantize=True)


def check_kernels(device: str) -> None:
    for hidden in (256, 384):  # 384: the norm's power-of-two block holds a group past the row
        check_add_rmsnorm(device, hidden, (3,), with_delta=True)
        check_add_rmsnorm(device, hidden, (1, 3), with_delta=False)
    check_silu_mul(device, 384, (3,))  # 3 groups in a block of 8
    check_silu_mul(device, 1152, (3, 1))  # two blocks, the second partly past the row
    from quantroll.kernels.fused import add_rmsnorm, silu_mul

    with pytest.raises(ValueError, match="multiple of 128"):
        add_rmsnorm(torch.zeros(2, 320, dtype=torch.bfloat16, device=device), None,
                    torch.ones(320, dtype=torch.bfloat16, device=device), 1e-6, quantize=True)
    with pytest.raises(ValueError, match="multiple of 128"):
        silu_mul(torch.zeros(2, 640, dtype=torch.bfloat16, device=device), quantize=True)


def tiny_fp8_model(device: str, intermediate: int = 384, fuse_activation_quant: bool = True):
    """Two layers whose q/k/v and gate/up fuse (128-row blocks) and run on the fp8 backend,
    prepared from the plan a GPU engine would choose (fused kernels on)."""
    from quantroll.bench.shapes import random_model
    from quantroll.formats import get_format
    from quantroll.kernels.choices import EngineKernels
    from quantroll.model.config import ModelConfig
    from quantroll.model.kernel_config import ForwardPlan, KernelConfig

    cfg = ModelConfig(model_type="qwen3", vocab_size=320, hidden_size=256, intermediate_size=intermediate,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      rms_norm_eps=1e-6, max_position_embeddings=64)
    model = random_model(cfg, device, fmt=get_format("fp8"))
    kernels = KernelConfig(gpu=EngineKernels(fuse_activation_quant=fuse_activation_quant))
    model.prepare_(ForwardPlan(kernels=kernels, linear_backend="fp8", fused_ops=True, fuse_projections=True))
    return model


def count_act_quant_launches(monkeypatch_setattr) -> list[int]:
    """Counts the FP8 linears' own activation-quantization calls from now on."""
    from quantroll.kernels import fp8_linear

    calls = [0]
    original = fp8_linear.quantize_activation_fp8

    def counted(x2d):
        calls[0] += 1
        return original(x2d)

    monkeypatch_setattr(fp8_linear, "quantize_activation_fp8", counted)
    return calls


def check_model_interpreted() -> None:
    """The fused forward of a tiny FP8 model on CPU tensors (they stand in for the GPU:
    the MLP's device test is forced), prefill- and decode-shaped: the same bits with the
    fusion on or off, and only o_proj quantizing its own input when on."""
    from quantroll.model import layers
    from quantroll.model.layers import causal_attend

    layers._on_gpu = lambda x: True
    calls = count_act_quant_launches(setattr)
    # own launches per layer without / with the fusion; at 320, gate/up do not fuse (nor quantize ahead)
    for intermediate, launches in ((384, {False: 4, True: 1}), (320, {False: 5, True: 4})):
        models = {fuse: tiny_fp8_model("cpu", intermediate, fuse) for fuse in (False, True)}  # same weights (seeded)
        for shape in ((1, 6), (3, 1)):
            ids = torch.randint(0, 320, shape, generator=torch.Generator().manual_seed(sum(shape)))
            positions = torch.arange(shape[1]).expand(shape)
            outs = {}
            for fuse in (False, True):
                inner = models[fuse].model
                calls[0] = 0
                with torch.no_grad():
                    x = inner.embed_tokens(ids)
                    cos, sin = inner.rotary(positions, x.dtype)
                    outs[fuse] = inner._forward_fused(x, cos, sin, causal_attend, None)
                assert calls[0] == 2 * launches[fuse], (intermediate, shape, fuse, calls[0])
            assert torch.equal(outs[True], outs[False]), (intermediate, shape)


# -- tests -----------------------------------------------------------------------------


def test_consumer_rule():
    """Only a block-FP8 linear on the fp8 backend with whole 1x128 input groups takes one."""
    from quantroll.formats import get_format
    from quantroll.kernels.choices import EngineKernels
    from quantroll.model.kernel_config import ForwardPlan, KernelConfig
    from quantroll.model.layers import takes_fp8_activation
    from quantroll.model.linear import QLinear

    def layer(n_in: int, fmt: str | None, plan: ForwardPlan) -> QLinear:
        out = QLinear(n_in, 128, fmt=get_format(fmt) if fmt else None)
        out.plan = plan  # a lone layer's hand-over (CausalLM.prepare_ does it for a model)
        return out

    on_fp8 = ForwardPlan(linear_backend="fp8")
    assert not takes_fp8_activation(layer(256, "fp8", ForwardPlan()))  # emulated backend
    assert takes_fp8_activation(layer(256, "fp8", on_fp8))
    assert not takes_fp8_activation(None)
    assert not takes_fp8_activation(layer(256, None, on_fp8))
    assert not takes_fp8_activation(layer(320, "fp8", on_fp8))
    assert not takes_fp8_activation(layer(256, "mxfp8", on_fp8))
    no_fusion = KernelConfig(gpu=EngineKernels(fuse_activation_quant=False))
    assert not takes_fp8_activation(layer(256, "fp8", ForwardPlan(kernels=no_fusion, linear_backend="fp8")))


@needs_triton
def test_kernels_and_model_under_interpreter():
    run_interpreted([__file__], "fused quantization ok", timeout=300)


gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and triton")


@gpu
@pytest.mark.gpu
def test_kernels_on_gpu():
    check_kernels("cuda")
    for hidden in (4096, 5120):  # real widths; 5120 in a block of 8192
        check_add_rmsnorm("cuda", hidden, (16,), with_delta=True)
    check_silu_mul("cuda", 12288, (64,))
    check_decode_attention("cuda")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_fp8_engine_same_bits_with_and_without_fused_quantization(graphs, monkeypatch):
    """Bit-identical quantization -> bit-identical GEMM inputs -> the same tokens and
    logprobs; prefill goes through the fused forward too (144 rows: the cuBLAS path)."""
    import dataclasses

    from quantroll.bench.shapes import random_model, shape_config
    from quantroll.engine import Engine, SamplingParams
    from quantroll.formats import get_format
    from quantroll.kernels.choices import EngineKernels
    from quantroll.model.kernel_config import KernelConfig

    fp8 = get_format("fp8")
    cfg = dataclasses.replace(shape_config("qwen3-8b", 2), vocab_size=4096)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(), seed=5)
    prompts = [list(range(1, 73)), list(range(100, 172))]
    calls = count_act_quant_launches(monkeypatch.setattr)
    results, launches = {}, {}
    for fuse in (False, True):  # a model per engine (seeded: the same weights), each prepared from its plan
        model = random_model(cfg, "cuda", fmt=fp8)
        engine = Engine.from_model(model, fp8, "cuda", fp8_kernels=True, cuda_graphs=graphs,
                                   kernels=KernelConfig(gpu=EngineKernels(fuse_activation_quant=fuse)))
        calls[0] = 0
        results[fuse] = engine.generate(prompts, params)
        assert engine.last_stats["kernels"]["fuse_activation_quant"] is fuse
        launches[fuse] = calls[0]
        forwards = 1 + engine.last_stats["decode_steps"]  # the prefill, then whole chunks of decode steps
    for a, b in zip(results[False], results[True]):
        assert a.tokens == b.tokens
        assert a.logprobs == b.logprobs
    if not graphs:  # per forward and layer: 4 linears quantize; fused, only the prefill's o_proj (a decode
        # step's attention hands it over quantized). Decode steps run in chunks of SchedulerConfig.decode_steps,
        # 8 on a GPU: 16 steps for these 11 tokens
        assert launches == {False: forwards * 2 * 4, True: 1 * 2 * 1}, launches


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    check_kernels("cpu")
    check_model_interpreted()
    print("fused quantization ok")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

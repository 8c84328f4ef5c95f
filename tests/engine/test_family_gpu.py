"""GPU paths of the families without QK-norm (Llama, Qwen2 with its q/k/v biases): the
decode store kernel without norms against the model's own rotary (bit for bit on a BF16
cache, and quantized as the reference on an FP8 one), and the engine (fused q/k/v with
biases, that kernel, fused norms, CUDA graphs) against the unfused engine and against a
float32 full forward. Run on the device (skipped without CUDA)."""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
triton = pytest.importorskip("triton")

from quantroll.bench.shapes import random_model, shape_config  # noqa: E402
from tests.engine.logprob_errors import mean_errors  # noqa: E402
from quantroll.engine import Engine, SamplingParams  # noqa: E402
from quantroll.engine.paged_cache import AttentionBatch, PagedKVCache  # noqa: E402
from quantroll.formats import get_format  # noqa: E402
from quantroll.formats.kv_fp8 import dequantize_kv, quantize_kv  # noqa: E402
from quantroll.kernels import paged_attention  # noqa: E402
from quantroll.model.rope import apply_rotary  # noqa: E402

DEV = "cuda"
FAMILIES = ["llama", "qwen2"]


def _cfg(model_type, heads=32, kv_heads=8, head_dim=128):
    cfg = shape_config("qwen3-8b", 2)
    return dataclasses.replace(cfg, model_type=model_type, vocab_size=4096, num_attention_heads=heads,
                               num_key_value_heads=kv_heads, head_dim=head_dim)


def test_rope_store_kernel_matches_the_model_rotary(monkeypatch):
    """As test_paged_attention_gpu's Qwen3 test, without the QK-norms: q and k within the
    rounding the model's BF16 rotary makes (the kernel rounds in float32 once where PyTorch
    rounds each product: a BF16 ulp apart), v stored as given, and the FP8 cache holding
    exactly the reference quantization of what the BF16 cache holds."""
    torch.manual_seed(0)
    heads, kv, dim, b = 8, 2, 128, 3
    cfg = _cfg("llama", heads, kv, dim)
    qkv = torch.randn(b, (heads + 2 * kv) * dim, device=DEV, dtype=torch.bfloat16)
    pos = torch.tensor([3, 17, 39], device=DEV)
    ang = pos[:, None].float() * (5e5 ** (-torch.arange(0, dim, 2, device=DEV).float() / dim))
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().to(torch.bfloat16)[:, None], emb.sin().to(torch.bfloat16)[:, None]
    slots = torch.tensor([5, 40, 17], device=DEV)
    stored = {}
    for kv_dtype in ("bf16", "fp8_e4m3"):
        cache = PagedKVCache(cfg, 4, 16, torch.bfloat16, kv_dtype, DEV, gpu_kernels=True)
        cache.batch = AttentionBatch(slots, torch.tensor([[1, 2, 3]] * b, dtype=torch.int32, device=DEV),
                                     (pos + 1).to(torch.int32), None)
        grabbed = []
        with monkeypatch.context() as m:
            m.setattr(paged_attention, "decode_attention", lambda q, *_, **__: grabbed.append(q) or q)
            paged_attention.decode_from_qkv(qkv, None, None, 0.0, cos, sin, cache, 0, cache.batch)
        stored[kv_dtype] = (cache, grabbed[0])
    qr, kr, vr = qkv.split([heads * dim, kv * dim, kv * dim], -1)
    q_ref = apply_rotary(qr.view(b, 1, heads, dim), cos, sin)[:, 0]
    k_ref = apply_rotary(kr.view(b, 1, kv, dim), cos, sin)[:, 0]
    v_ref = vr.view(b, kv, dim)
    bf16, q = stored["bf16"]
    scale = q_ref.float().abs().max().item()
    assert (q.float() - q_ref.float()).abs().max().item() <= 2**-6 * scale
    assert torch.equal(stored["fp8_e4m3"][1], q)  # the queries do not depend on the cache's dtype
    k_got = bf16.k[0].view(-1, kv, dim)[slots]
    assert (k_got.float() - k_ref.float()).abs().max().item() <= 2**-6 * scale
    assert torch.equal(bf16.v[0].view(-1, kv, dim)[slots], v_ref)
    k8, v8 = stored["fp8_e4m3"][0].gather(0, slots, torch.float32)
    assert torch.equal(k8, dequantize_kv(*quantize_kv(k_got)).float())
    assert torch.equal(v8, dequantize_kv(*quantize_kv(v_ref)).float())


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("fmt", [None, "fp8"])
def test_engine_fused_paths_match_the_unfused_engine(model_type, fmt, monkeypatch):
    """Fused q/k/v (with Qwen2's biases stacked), the store kernel without norms and the fused
    norms against the engine whose decode runs the model's ops: same samples until a near-tie."""
    cfg = _cfg(model_type)
    form = get_format(fmt) if fmt else None

    def build():  # the engine fuses its model's projections in place: one model an engine
        base = random_model(cfg, DEV, seed=1)
        return base if form is None else random_model(cfg, DEV, fmt=form, source=base)

    params = SamplingParams(temperature=1.0, max_new_tokens=16, stop_token_ids=(), seed=4)
    prompts = [[1, 2, 3], list(range(30, 50))]
    with monkeypatch.context() as m:  # the reference: the model's own ops at decode (no fused store kernel)
        m.setattr(PagedKVCache, "attend_qkv", property(lambda self: None))
        plain = Engine.from_model(build(), form, DEV, fused_kernels=False, cuda_graphs=False).generate(prompts, params)
    calls = []
    real = paged_attention.decode_from_qkv
    monkeypatch.setattr(paged_attention, "decode_from_qkv",
                        lambda qkv, q_w, *a, **kw: calls.append(q_w is None) or real(qkv, q_w, *a, **kw))
    engine = Engine.from_model(build(), form, DEV, fused_kernels=True, cuda_graphs=False)
    attn = engine.model.model.layers[0].self_attn
    assert attn.qkv_proj is not None and attn.q_norm is None
    assert (attn.qkv_proj.bias is not None) == (model_type == "qwen2")
    fused = engine.generate(prompts, params)
    assert calls and all(calls), "the fused decode path without QK-norm did not run"
    if form is not None:
        # FP8: the two engines round activations to FP8 on differently rounded BF16 inputs (a
        # BF16 ulp flips an FP8 code), so their samples part early; each engine's logprobs are
        # held against a float32 forward of the BF16 source instead, the fused no further off.
        f32 = random_model(cfg, DEV, seed=1).float()
        plain_err, _ = mean_errors(plain, f32, f32, DEV)
        fused_err, _ = mean_errors(fused, f32, f32, DEV)
        print(f"{model_type} fp8: mean |logprob - float32| unfused {plain_err:.3e}, fused {fused_err:.3e}")
        assert fused_err <= 1.5 * plain_err
        return
    for a, b in zip(plain, fused):
        n = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), len(a.tokens))
        assert n >= 4, (a.tokens, b.tokens)  # same samples until rounding flips a near-tie
        assert torch.allclose(torch.tensor(a.logprobs[:n]), torch.tensor(b.logprobs[:n]), atol=5e-2)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_engine_logprobs_are_as_close_to_float32_as_a_bf16_full_forward(model_type):
    """As test_gpu_engine's test of the same name, on the CUDA-graph engine of each family."""
    cfg = _cfg(model_type)
    model = random_model(cfg, DEV, seed=2)
    f32 = random_model(cfg, DEV, seed=2).float()
    bf16 = random_model(cfg, DEV, seed=2)
    engine = Engine.from_model(model, None, DEV)
    res = engine.generate([list(range(7 * i, 7 * i + 5 + i)) for i in range(12)],
                          SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(), seed=3))
    engine_mean, forward_mean = mean_errors(res, bf16, f32, DEV)
    print(f"{model_type}: mean |logprob - float32| engine {engine_mean:.2e}, BF16 full forward {forward_mean:.2e}")
    assert engine_mean <= 1.5 * forward_mean

"""The decode store kernel with its QK-norm off (kv_store_triton.store_kv_kernel,
QK_NORM False: the families without QK-norm) on a CPU, under Triton's interpreter (this file run as a script, float32): rotary and the k/v
store bit for bit against the model's apply_rotary, and whole Llama / Qwen2 engines (the
latter with q/k/v biases in the fused projection) whose cache runs the kernels against
ones that run the reference. The device runs them compiled (test_family_gpu.py)."""

from __future__ import annotations

import dataclasses

import torch

from tests.interpreted import needs_new_interpreter, needs_triton, run_interpreted


@needs_triton
@needs_new_interpreter
def test_rope_store_kernel_under_the_interpreter():
    run_interpreted([__file__], "rope store ok", timeout=900)


def _cfg(model_type, heads=4, kv_heads=2, head_dim=64):
    from quantroll.bench.shapes import shape_config

    return dataclasses.replace(shape_config("qwen3-8b", 2), model_type=model_type, hidden_size=256,
                               intermediate_size=512, num_attention_heads=heads, num_key_value_heads=kv_heads,
                               head_dim=head_dim, vocab_size=512)


def check_store() -> None:
    from quantroll.engine.paged_cache import AttentionBatch, PagedKVCache
    from quantroll.kernels import paged_attention
    from quantroll.model.rope import apply_rotary

    heads, kv, dim, b = 6, 2, 64, 3
    cfg = _cfg("llama", heads, kv, dim)
    qkv = torch.randn(b, (heads + 2 * kv) * dim)
    pos = torch.tensor([3, 17, 39])
    ang = pos[:, None].float() * (5e5 ** (-torch.arange(0, dim, 2).float() / dim))
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    slots = torch.tensor([5, 40, 17])
    cache = PagedKVCache(cfg, 4, 16, torch.float32, "bf16", "cpu", gpu_kernels=True)
    cache.batch = AttentionBatch(slots, torch.tensor([[1, 2, 3]] * b, dtype=torch.int32), (pos + 1).to(torch.int32),
                                 None)
    grabbed = []
    real = paged_attention.decode_attention
    paged_attention.decode_attention = lambda q, *_, **__: grabbed.append(q) or q
    try:
        paged_attention.decode_from_qkv(qkv, None, None, 0.0, cos, sin, cache, 0, cache.batch)
    finally:
        paged_attention.decode_attention = real
    qr, kr, vr = qkv.split([heads * dim, kv * dim, kv * dim], -1)
    assert torch.equal(grabbed[0], apply_rotary(qr.view(b, 1, heads, dim), cos, sin)[:, 0])
    assert torch.equal(cache.k[0].view(-1, kv, dim)[slots], apply_rotary(kr.view(b, 1, kv, dim), cos, sin)[:, 0])
    assert torch.equal(cache.v[0].view(-1, kv, dim)[slots], vr.view(b, kv, dim))


def check_engines() -> None:
    from quantroll.bench.shapes import random_model
    from quantroll.engine import Engine, SamplingParams

    for model_type in ("llama", "qwen2", "qwen3"):  # qwen3: the same kernel with its QK-norm on
        model = random_model(_cfg(model_type), "cpu").float()
        prompts = [list(range(3 + i, 20 + 2 * i)) for i in range(3)]
        params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(), seed=5)
        results = {}
        for kernels in (False, True):
            engine = Engine.from_model(model, None, "cpu", dtype=torch.float32)
            engine._ensure_cache()
            engine._kv.gpu_kernels = kernels
            results[kernels] = engine.generate(prompts, params)
        attn = model.model.layers[0].self_attn
        assert attn.qkv_proj is not None and (attn.qkv_proj.bias is not None) == (model_type == "qwen2")
        for a, b in zip(results[False], results[True]):
            assert a.tokens == b.tokens, model_type
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4, model_type


if __name__ == "__main__":
    torch.manual_seed(0)
    check_store()
    check_engines()
    print("rope store ok")

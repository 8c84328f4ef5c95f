"""The one-launch decode attention (decode_attention_qkv) against the two launches it
replaces (qk_norm_rope_cache, then decode_attention) and against a float64 decode step.

CPU: the checks run under Triton's interpreter in a subprocess (this file run as a
script). There the two paths give the same bits on q/k values that are multiples of 1/16
up to 4 (sums of squares exact in float32: the interpreter adds a vector in numpy's
order, not the GPU butterfly that the fused kernel spells out, _sum_squares, which is
checked on its own). The interpreter's BF16 dots return garbage (Triton 3.8), so the
attention arithmetic is checked in float32 against float64. GPU: both paths against
float64 on any values (their bits differ in last places there: see
decode_attention.FUSE_QKV_ATTENTION), and FP8 engines with the fusion on and off."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.switches import switched
from tests.interpreted import needs_new_interpreter, needs_triton, run_interpreted

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None
GPU = torch.cuda.is_available() and HAS_TRITON
EPS = 1e-6

if HAS_TRITON:
    import triton
    import triton.language as tl

    from quantroll.kernels.decode_attention_triton import _sum_squares

    @triton.jit
    def _sum_squares_probe(h_ptr, out_ptr, R: tl.constexpr, HALF: tl.constexpr):
        h = tl.load(h_ptr + tl.arange(0, R)[:, None] * HALF + tl.arange(0, HALF)[None, :])
        tl.store(out_ptr + tl.arange(0, R), _sum_squares(h, R, HALF))


def sum_squares(h: torch.Tensor) -> torch.Tensor:
    """_sum_squares on float32 rows h [R, HALF]."""
    out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    _sum_squares_probe[(1,)](h.contiguous(), out, R=h.shape[0], HALF=h.shape[1])
    return out


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).cpu()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_u8(a), _u8(b))


def _qkv(batch: int, heads: int, kv_heads: int, dim: int, exact_sums: bool, gen: torch.Generator) -> torch.Tensor:
    """The fused projection's rows. exact_sums: q and k values k/16 with |k| <= 64, whose
    squares (multiples of 2^-8 up to 16) sum exactly in float32 in any order."""
    qk = (heads + kv_heads) * dim
    x = torch.randn(batch, qk + kv_heads * dim, generator=gen)
    if exact_sums:
        x[:, :qk] = torch.randint(-64, 65, (batch, qk), generator=gen) / 16
    else:
        x[:, :qk] *= torch.logspace(-2, 1, dim).repeat(heads + kv_heads)  # scales across each head
    return x.to(torch.bfloat16)


def _rotary(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, 1, D] as the model's Rotary makes them (halves repeated)."""
    from quantroll.model.config import ModelConfig
    from quantroll.model.rope import Rotary

    cfg = ModelConfig(model_type="qwen3", vocab_size=8, hidden_size=dim, intermediate_size=dim, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=dim, rms_norm_eps=EPS,
                      max_position_embeddings=4096)
    return Rotary(cfg)(positions[:, None], torch.bfloat16)


def make_case(device: str, positions: list[int], heads: int, kv_heads: int, dim: int, slots: int, exact_sums: bool,
              seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Inputs of one decode step; every cache slot holds random values beforehand (stale
    entries past a sequence's position must not be read)."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(positions)
    pos = torch.tensor(positions, dtype=torch.int64)
    cos, sin = _rotary(pos, dim)
    case = dict(qkv=_qkv(batch, heads, kv_heads, dim, exact_sums, gen),
                q_norm_w=(1 + 0.2 * torch.randn(dim, generator=gen)).to(torch.bfloat16),
                k_norm_w=(1 + 0.2 * torch.randn(dim, generator=gen)).to(torch.bfloat16),
                cos=cos, sin=sin,
                k_cache=torch.randn(batch, slots, kv_heads, dim, generator=gen).to(torch.bfloat16),
                v_cache=torch.randn(batch, slots, kv_heads, dim, generator=gen).to(torch.bfloat16),
                rows=torch.arange(batch), positions=pos)
    case = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in case.items()}
    case.update(heads=heads, kv_heads=kv_heads, head_dim=dim)
    return case


def _with_fresh_caches(case: dict) -> dict:
    return {**case, "k_cache": case["k_cache"].clone(), "v_cache": case["v_cache"].clone()}


def two_launches(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output [B, H, D], k cache, v cache) the default path leaves."""
    from quantroll.kernels.decode_attention import decode_attention
    from quantroll.kernels.fused import qk_norm_rope_cache

    c = _with_fresh_caches(case)
    q = qk_norm_rope_cache(c["qkv"], c["q_norm_w"], c["k_norm_w"], EPS, c["cos"], c["sin"], c["k_cache"], c["v_cache"],
                           c["rows"], c["positions"], c["heads"], c["kv_heads"], c["head_dim"])
    return decode_attention(q, c["k_cache"], c["v_cache"], c["positions"] + 1), c["k_cache"], c["v_cache"]


def one_launch(case: dict, quantize: bool = False):
    """(output or Fp8Activation, k cache, v cache) of decode_attention_qkv."""
    from quantroll.kernels.decode_attention import decode_attention_qkv

    c = _with_fresh_caches(case)
    out = decode_attention_qkv(c["qkv"], c["q_norm_w"], c["k_norm_w"], EPS, c["cos"], c["sin"], c["k_cache"],
                               c["v_cache"], c["rows"], c["positions"], c["heads"], c["kv_heads"], c["head_dim"],
                               quantize=quantize)
    return out, c["k_cache"], c["v_cache"]


def check_case(case: dict) -> None:
    from quantroll.kernels.fp8_linear import Fp8Activation, quantize_activation_fp8

    ref, k_ref, v_ref = two_launches(case)
    out, k, v = one_launch(case)
    assert _same_bits(out, ref), "attention output"
    assert _same_bits(k, k_ref), "k cache"
    assert _same_bits(v, v_ref), "v cache"
    assert not torch.equal(k_ref, case["k_cache"]), "the step wrote no key"
    if case["head_dim"] != 128:
        return
    act, k, v = one_launch(case, quantize=True)
    batch, width = ref.shape[0], ref.shape[1] * ref.shape[2]
    assert isinstance(act, Fp8Activation) and act.shape == (batch, width) and act.dtype == ref.dtype
    assert act.scales.shape == (batch, width // 128) and act.scales.stride() == (1, batch)
    codes, scales = quantize_activation_fp8(ref.reshape(batch, width))  # the launch the fusion saves
    assert _same_bits(act.codes, codes), "codes differ from act_quant_fp8_kernel's"
    assert torch.equal(act.scales.cpu().view(torch.int32), scales.cpu().view(torch.int32)), "scales"
    assert _same_bits(k, k_ref) and _same_bits(v, v_ref), "caches with quantize"


def check_kernels(device: str, exact_sums: bool) -> None:
    """B = 3 at positions 0 (the new key alone), 5 and 70 (two key blocks of 64), in a
    cache of 80 slots; GQA groups of 4 and 1; head_dim 128 (with quantize) and 64."""
    for kv_heads in (2, 8):
        for dim in (128, 64):
            check_case(make_case(device, [5, 0, 70], 8, kv_heads, dim, 80, exact_sums, seed=kv_heads + dim))
    from quantroll.kernels.decode_attention import decode_attention_qkv

    case = make_case(device, [1], 2, 1, 64, 4, exact_sums)
    with pytest.raises(ValueError, match="group per head"):
        one_launch(case, quantize=True)
    with pytest.raises(ValueError, match="power of two"):
        decode_attention_qkv(*(None,) * 10, 2, 1, 256)


def check_sum_order(device: str) -> None:
    """_sum_squares adds like the one-warp [D/2] vector of qk_norm_rope_cache_kernel on the
    GPU: per lane two adjacent squares (D = 128), then a butterfly over the lanes starting
    with lanes 16 apart, i.e. halves folded onto each other. On values over eight decades,
    where other orders give other sums."""
    gen = torch.Generator().manual_seed(3)
    for half in (64, 32, 16, 8):
        rows = 64
        h = (torch.randn(rows, half, generator=gen) * torch.logspace(-4, 4, half)).to(torch.bfloat16).float()
        sq = h * h
        want = sq[:, 0::2] + sq[:, 1::2] if half == 64 else sq
        while want.shape[1] > 1:
            n = want.shape[1] // 2
            want = want[:, :n] + want[:, n:]
        got = sum_squares(h.to(device)).cpu()
        assert torch.equal(got.view(torch.int32), want[:, 0].view(torch.int32)), half
        sequential = sq.cumsum(1)[:, -1]
        assert not torch.equal(sequential, want[:, 0]), "values too tame to tell orders apart"


def tiny_model(device: str):
    """Two layers of head_dim 128 (one FP8 group per head), q/k/v fused, on the fp8 backend."""
    from quantroll.bench.shapes import random_model
    from quantroll.formats import get_format
    from quantroll.model.config import ModelConfig

    cfg = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=128, rms_norm_eps=EPS,
                      max_position_embeddings=64)
    model = random_model(cfg, device, fmt=get_format("fp8"))
    model.fuse_projections_()
    for layer in model.quantized_linears().values():
        layer.backend = "fp8"
    return model


def count_calls(patch, require_quantize: bool = False):
    """Wrap o_proj's own activation quantization and the fused kernel's wrapper with call
    counters, installed by ``patch`` (setattr, or monkeypatch.setattr); returns the
    counters and the two originals (for restoring by hand)."""
    from quantroll.kernels import decode_attention, fp8_linear

    calls = {"quant": 0, "fused": 0}
    quant, fused = fp8_linear.quantize_activation_fp8, decode_attention.decode_attention_qkv

    def counted_quant(x2d):
        calls["quant"] += 1
        return quant(x2d)

    def counted_fused(*args, **kwargs):
        calls["fused"] += 1
        assert kwargs["quantize"] or not require_quantize
        return fused(*args, **kwargs)

    patch(fp8_linear, "quantize_activation_fp8", counted_quant)
    patch(decode_attention, "decode_attention_qkv", counted_fused)
    return calls, (quant, fused)


def check_decode_step_interpreted() -> None:
    """The model's decode branch on CPU tensors through KVCache.attend_qkv: with the switch
    on, the fused kernel runs, o_proj gets its input quantized (one own quantization fewer
    per layer) and the step's result matches the two launches' (to the ulps in which the
    interpreter's sums differ: see the module docstring; bitwise on the GPU)."""
    from quantroll.engine.kv_cache import KVCache
    from quantroll.kernels import decode_attention, fp8_linear

    model = tiny_model("cpu")
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    calls, (quant, fused) = count_calls(setattr, require_quantize=True)
    results = {}
    for on in (False, True):
        cache = KVCache(cfg, 2, 8, torch.bfloat16, "cpu", decode_kernel=True)
        with torch.no_grad():
            cache.positions = torch.arange(5).expand(2, 5)
            model.hidden(ids[:, :5], cache.positions, cache)
            decode_attention.FUSE_QKV_ATTENTION = on
            calls.update(quant=0, fused=0)
            cache.positions = torch.full((2, 1), 5)
            results[on] = (model.hidden(ids[:, 5:], cache.positions, cache), cache.k, cache.v)
            decode_attention.FUSE_QKV_ATTENTION = False
        assert calls == {"quant": 2 * (3 if on else 4), "fused": 2 if on else 0}, (on, calls)
    (h_off, k_off, v_off), (h_on, k_on, v_on) = results[False], results[True]
    for layer in range(2):
        assert _same_bits(v_on[layer], v_off[layer])
        assert torch.allclose(k_on[layer].float(), k_off[layer].float(), rtol=2**-7, atol=0)
    rel = ((h_on.float() - h_off.float()).norm() / h_off.float().norm()).item()
    assert rel < 1e-2, rel
    fp8_linear.quantize_activation_fp8, decode_attention.decode_attention_qkv = quant, fused


# -- tests -----------------------------------------------------------------------------


@needs_triton
@needs_new_interpreter
def test_fused_decode_attention_under_interpreter():
    run_interpreted([__file__], "fused decode attention ok", timeout=300)


def test_attention_tiles_follow_the_waves():
    """A third pipeline stage while the (sequence, KV head) programs fit one wave of SMs
    (measured faster there, slower beyond: decode_attention.ONE_WAVE_TILES); TILES forces
    one shape."""
    from quantroll.kernels import decode_attention as attention

    assert attention.tiles_for(128, 132).num_stages == 3  # Qwen3-8B, batch 16
    assert attention.tiles_for(133, 132).num_stages == 2
    assert attention.tiles_for(512, 132) == attention.AttentionTiles()  # batch 64
    forced = attention.AttentionTiles(block_s=32, num_warps=8, num_stages=1)
    with switched(attention, "TILES", forced):
        assert attention.tiles_for(128, 132) == attention.tiles_for(512, 132) == forced


def test_switch_is_on_by_default():
    from quantroll.kernels import decode_attention

    assert decode_attention.FUSE_QKV_ATTENTION is True
    assert [d for d in (8, 16, 64, 96, 128, 256) if decode_attention.fuses_qkv(d)] == [16, 64, 128]


gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and triton")


def reference_fp64(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention output [B, H, D], new keys [B, Hkv, D]) of one decode step in float64 from
    the case's BF16 inputs: q/k RMSNorm, rotary (rotate-half), the new key and value at
    positions[b], attention over 0..positions[b]. No intermediate rounding: both kernel
    paths round q and k to BF16, so each sits a few BF16 ulps from this."""
    qkv = case["qkv"].double().cpu()
    heads, kv_heads, dim = case["heads"], case["kv_heads"], case["head_dim"]
    b = qkv.shape[0]
    q = qkv[:, : heads * dim].view(b, heads, dim)
    k = qkv[:, heads * dim: (heads + kv_heads) * dim].view(b, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim:].view(b, kv_heads, dim)
    cos, sin = case["cos"].double().cpu(), case["sin"].double().cpu()  # [B, 1, D]

    def norm_rope(x, w):
        x = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w.double().cpu()
        rotated = torch.cat((-x[..., dim // 2:], x[..., : dim // 2]), dim=-1)
        return x * cos + rotated * sin

    qn, kn = norm_rope(q, case["q_norm_w"]), norm_rope(k, case["k_norm_w"])
    kc, vc = case["k_cache"].double().cpu().clone(), case["v_cache"].double().cpu().clone()
    out = torch.empty(b, heads, dim, dtype=torch.float64)
    for i, p in enumerate(case["positions"].tolist()):
        kc[i, p], vc[i, p] = kn[i], v[i]
        keys = kc[i, : p + 1].repeat_interleave(heads // kv_heads, dim=1)  # [S, H, D]
        vals = vc[i, : p + 1].repeat_interleave(heads // kv_heads, dim=1)
        w = torch.softmax(torch.einsum("hd,shd->hs", qn[i], keys) * dim**-0.5, dim=-1)
        out[i] = torch.einsum("hs,shd->hd", w, vals)
    return out, kn


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


def check_case_against_fp64(case: dict) -> tuple[float, float]:
    """The fused kernel as close to the float64 step as the two launches are (within 25%
    of their error, plus 1e-4 of the norm): the output, the new keys written to the cache;
    the values are a copy (same bits). Returns the two output errors."""
    ref, kn = reference_fp64(case)
    two, k2, v2 = two_launches(case)
    one, k1, v1 = one_launch(case)
    assert _same_bits(v1, v2), "v cache"
    rows = torch.arange(ref.shape[0])
    pos = case["positions"].cpu()
    keys = {name: k.cpu()[rows, pos] for name, k in (("two", k2), ("one", k1))}  # the new keys [B, Hkv, D]
    assert _rel(keys["one"], kn) <= 1.25 * _rel(keys["two"], kn) + 1e-4, "k cache"
    e_two, e_one = _rel(two, ref), _rel(one, ref)
    assert e_two < 1e-2, f"the two launches are {e_two:.1e} from the float64 step: the reference is off"
    assert e_one <= 1.25 * e_two + 1e-4, (e_one, e_two)
    return e_one, e_two


@gpu
@pytest.mark.gpu
def test_kernels_on_gpu():
    """On the GPU the one launch does not give the two launches' bits (Triton orders and
    contracts the q/k norm and rotary arithmetic differently from version to version: on
    the H200 with Triton 3.6 they differ in last bits): both are held to a float64
    reference instead, on Qwen3-8B's heads at long and uneven lengths and on GQA 1 and 4
    with head_dim 64; the FP8 output must still equal act_quant of its own BF16 output."""
    from quantroll.kernels.fp8_linear import quantize_activation_fp8

    cases = [make_case("cuda", [5, 0, 70], 8, kv, d, 80, exact_sums=False, seed=kv + d) for kv in (2, 8) for d in (128, 64)]
    cases += [make_case("cuda", [0, 1, 63, 64, 200, 511, 1000, 17][: 8 - seed], 32, 8, 128, 1024, exact_sums=False,
                        seed=seed) for seed in range(3)]
    for case in cases:
        e_one, e_two = check_case_against_fp64(case)
        print(f"heads {case['heads']}/{case['kv_heads']} dim {case['head_dim']}: rel. error vs float64 "
              f"one launch {e_one:.2e}, two launches {e_two:.2e}")
        if case["head_dim"] == 128:
            out, _, _ = one_launch(case)
            act, _, _ = one_launch(case, quantize=True)
            codes, scales = quantize_activation_fp8(out.reshape(out.shape[0], -1))
            assert _same_bits(act.codes, codes) and torch.equal(act.scales, scales), "FP8 output"


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_fp8_engine_with_and_without_fused_attention(graphs, monkeypatch):
    """The one-launch path (quantizing for o_proj) gives the engine the same tokens and
    logprobs to within last-bit effects (a random model's FP8 activations flip codes on
    them: up to ~0.02 in a logprob); eager, each decode step's o_proj no longer quantizes
    its own input."""
    import dataclasses

    from quantroll.bench.shapes import random_model, shape_config
    from quantroll.engine import Engine, SamplingParams
    from quantroll.formats import get_format
    from quantroll.kernels import decode_attention

    fp8 = get_format("fp8")
    cfg = dataclasses.replace(shape_config("qwen3-8b", 2), vocab_size=4096)
    model = random_model(cfg, "cuda", fmt=fp8)
    engine = Engine.from_model(model, fp8, "cuda", fp8_kernels=True, cuda_graphs=graphs)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(), seed=5)
    prompts = [list(range(1, 73)), list(range(100, 131)), list(range(200, 264))]
    calls, _ = count_calls(monkeypatch.setattr)
    results, counts = {}, {}
    for on in (False, True):
        monkeypatch.setattr(decode_attention, "FUSE_QKV_ATTENTION", on)
        calls.update(quant=0, fused=0)
        results[on] = engine.generate(prompts, params)
        counts[on] = dict(calls)
    diffs = []
    for a, b in zip(results[False], results[True]):
        assert a.tokens == b.tokens
        diffs += [abs(x - y) for x, y in zip(a.logprobs, b.logprobs)]
    mean = sum(diffs) / len(diffs)
    print(f"mean |logprob fused - two launches| {mean:.2e}, max {max(diffs):.2e}")
    assert mean < 1e-2 and max(diffs) < 0.1
    assert counts[False]["fused"] == 0 and counts[True]["fused"] > 0, counts
    if not graphs:  # o_proj quantizes in every forward (prefill + 11 decode steps, 2 layers), fused: prefill only
        assert (counts[False]["quant"], counts[True]["quant"]) == (12 * 2, 2), counts


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    check_sum_order("cpu")
    check_kernels("cpu", exact_sums=True)
    check_decode_step_interpreted()
    # The interpreter's BF16 dots return garbage (Triton 3.8: ~1e8 for unit inputs), so the
    # BF16 comparisons above hold only for the norms, rotary and cache writes; the attention
    # arithmetic of both paths is checked here in float32 against float64.
    for seed, (kv, d) in enumerate(((2, 128), (8, 64))):
        check_case_against_fp64(make_case("cpu", [5, 0, 70], 8, kv, d, 80, exact_sums=False, seed=seed,
                                          dtype=torch.float32))
    print("fused decode attention ok")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

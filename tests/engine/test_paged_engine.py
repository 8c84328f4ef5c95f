"""The engine's schedule must not change what it computes: preemption, chunked prefill,
prefix sharing, batch composition and admission order, against unconstrained runs and
against teacher-forced forward passes; the FP8 KV cache against its exact emulation."""

import pytest
import torch

from quantroll.engine import Engine, SamplingParams
from quantroll.engine.paged_cache import CacheConfig
from quantroll.engine.scheduler import SchedulerConfig
from quantroll.errors import QuantrollError
from quantroll.formats.kv_fp8 import dequantize_kv, quantize_kv
from quantroll.model.moe import RecordRouting

PROMPTS = [[5, 9, 17, 3, 8], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7], [42], [7, 7, 7, 7, 7, 7, 7, 7, 7]]


def engine(path, **kw):
    block = kw.pop("block_size", 4)
    cache = CacheConfig(block_size=block, memory_gb=kw.pop("memory_gb", None), kv_cache_dtype=kw.pop("kv", "bf16"),
                        prefix_sharing=kw.pop("sharing", True))
    return Engine(path, dtype=torch.float32, cache=cache, scheduler=SchedulerConfig(**kw))


def small_budget(path, blocks: int, **kw):
    """An engine whose pool holds ``blocks`` blocks of 4 tokens (one is scratch)."""
    probe = engine(path)
    gib = (blocks + 0.5) * probe._block_bytes() / 2**30
    return engine(path, memory_gb=gib, **kw)


def same(a, b, tol=2e-5):
    assert [r.tokens for r in a] == [r.tokens for r in b]
    for x, y in zip(a, b):
        assert x.finish_reason == y.finish_reason
        assert x.logprobs == pytest.approx(y.logprobs, abs=tol)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_pool_so_small_it_must_preempt_gives_the_same_samples(tiny_qwen3_dir, temperature):
    params = SamplingParams(temperature=temperature, max_new_tokens=14, seed=3, stop_token_ids=())
    free = engine(tiny_qwen3_dir).generate(PROMPTS, params)
    tight = small_budget(tiny_qwen3_dir, blocks=12)  # 11 usable blocks = 44 positions for 4 sequences of up to 27
    got = tight.generate(PROMPTS, params)
    assert tight.last_stats["preemptions"] > 0
    assert sum(r.preemptions for r in got) == tight.last_stats["preemptions"]
    same(got, free)


def test_decode_chunks_of_several_steps_equal_single_steps(tiny_qwen3_dir):
    params = SamplingParams(temperature=1.0, max_new_tokens=11, seed=8)
    one = engine(tiny_qwen3_dir, decode_steps=1).generate(PROMPTS, params)
    chunked = engine(tiny_qwen3_dir, decode_steps=8)
    eight = chunked.generate(PROMPTS, params)
    same(eight, one)
    # no chunk runs past every sequence's cap: 10 decode steps for 11 tokens, not 16
    assert chunked.last_stats["decode_steps"] == 10
    greedy = engine(tiny_qwen3_dir).generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=11))
    stopped = SamplingParams(temperature=0, max_new_tokens=11, stop_token_ids=(greedy[1].tokens[2],))
    a = engine(tiny_qwen3_dir, decode_steps=1).generate(PROMPTS, stopped)
    b = engine(tiny_qwen3_dir, decode_steps=8).generate(PROMPTS, stopped)
    same(b, a)
    assert b[1].finish_reason == "stop"


def test_chunked_prefill_equals_one_pass(tiny_qwen3_dir):
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)
    whole = engine(tiny_qwen3_dir).generate(PROMPTS, params)
    chunked = engine(tiny_qwen3_dir, max_num_batched_tokens=3)
    same(chunked.generate(PROMPTS, params), whole)
    assert chunked.last_stats["prefill_tokens"] == sum(map(len, PROMPTS))


def test_samples_do_not_depend_on_batch_composition_or_admission_order(tiny_qwen3_dir):
    params = SamplingParams(temperature=1.0, max_new_tokens=9, seed=21)
    eng = engine(tiny_qwen3_dir)
    together = eng.generate(PROMPTS, params)
    first_alone = eng.generate(PROMPTS[:1], params)[0]  # prompt 0 keeps seed 21 whatever runs beside it
    assert first_alone.tokens == together[0].tokens
    one_at_a_time = engine(tiny_qwen3_dir, max_num_seqs=1).generate(PROMPTS, params)
    same(one_at_a_time, together)


def test_prefix_shared_samples_equal_unshared_ones(tiny_qwen3_dir):
    n = 4
    prompts = [p for p in PROMPTS for _ in range(n)]  # RL's n samples per prompt, consecutive
    params = SamplingParams(temperature=1.0, max_new_tokens=7, seed=13)
    shared_engine = engine(tiny_qwen3_dir)
    shared = shared_engine.generate(prompts, params)
    saved = shared_engine.last_stats["prefill_tokens_saved"]
    # the prompts' full blocks before their last position, reused by n - 1 samples each
    assert saved == sum((n - 1) * ((len(p) - 1) // 4 * 4) for p in PROMPTS) > 0
    unshared_engine = engine(tiny_qwen3_dir, sharing=False)
    unshared = unshared_engine.generate(prompts, params)
    assert unshared_engine.last_stats["prefill_tokens_saved"] == 0
    assert unshared_engine.last_stats["prefill_tokens"] == shared_engine.last_stats["prefill_tokens"] + saved
    same(shared, unshared)
    again = shared_engine.generate(prompts[:1], params)[0]  # a call shares within itself only
    assert shared_engine.last_stats["prefill_tokens_saved"] == 0
    assert again.tokens == shared[0].tokens


def _teacher_forced_routes(model, res):
    rec = RecordRouting()
    with torch.no_grad():
        model(torch.tensor([res.prompt_tokens + res.tokens[:-1]]), routing=rec)
    return torch.stack([rec.chosen[layer] for layer in model.config.moe_layers], dim=1)


def test_routed_experts_fill_every_row_with_sharing_chunking_and_preemption(tiny_qwen3_moe_dir):
    prompts = [p for p in PROMPTS for _ in range(3)]
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=4, stop_token_ids=())
    eng = small_budget(tiny_qwen3_moe_dir, blocks=16, max_num_batched_tokens=6)
    results = eng.generate(prompts, params)
    assert eng.last_stats["preemptions"] > 0 and eng.last_stats["prefill_tokens_saved"] > 0
    cfg = eng.config
    for res in results:
        assert res.routed_experts.shape == (len(res.prompt_tokens) + 9, len(cfg.moe_layers), cfg.num_experts_per_tok)
        want = _teacher_forced_routes(eng.model, res)
        # top-k order may differ only where probabilities tie: compare as sets per row
        assert torch.equal(res.routed_experts.long().sort(-1).values, want.sort(-1).values)


def test_fp8_kv_quantization_against_float64():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 64) * torch.logspace(-3, 2, 5)[:, None, None]
    x[2, 1] = 0.0
    codes, scales = quantize_kv(x)
    x64 = x.double()
    amax = x64.abs().amax(-1)
    want_scale = amax / 448
    assert torch.equal(scales, want_scale.float())
    assert scales[2, 1] == 0 and torch.equal(dequantize_kv(codes, scales)[2, 1], torch.zeros(64))
    deq = dequantize_kv(codes, scales).double()
    # round to nearest: within half an E4M3 step at the stored scale (3 mantissa bits: 2^-4 relative, 2^-9 subnormal)
    step = torch.where(x64.abs() / scales.double()[..., None] >= 2**-6,
                       2.0 ** (torch.floor(torch.log2(x64.abs().clamp(min=1e-30) / scales.double()[..., None])) - 3),
                       torch.full_like(x64, 2.0**-9)) * scales.double()[..., None]
    assert ((deq - x64).abs() <= step / 2 + 1e-12).all()
    assert (codes.float().abs().amax(-1)[amax > 0] == 448).all()  # the largest element maps onto 448 exactly


def test_fp8_kv_quantization_never_writes_the_nan_code():
    """NaN and infinite elements store finite codes (the GPU kernels read whole blocks past a
    sequence's end, where a kept NaN byte would survive a zero probability)."""
    x = torch.randn(3, 2, 16)
    x[0, 1, 3] = float("nan")
    x[1, 0, 7] = float("inf")
    x[2, 0, 0] = float("-inf")
    codes, _ = quantize_kv(x)
    assert not torch.isnan(codes.float()).any()
    assert codes[0, 1, 3].float() == 0
    clean, _ = quantize_kv(x[:, 1:])  # vectors without a NaN are untouched by it
    assert torch.equal(clean.view(torch.uint8)[1:], codes[1:, 1:].view(torch.uint8))


def test_fp8_kv_engine_equals_a_forward_with_quantized_keys_and_values(tiny_qwen3_dir):
    import torch.nn.functional as F

    def fp8_kv_attend(layer, q, k, v):
        k, v = (dequantize_kv(*quantize_kv(t)).to(t.dtype) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                             enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)

    eng = engine(tiny_qwen3_dir, kv="fp8")
    assert eng.kv_cache_label == "fp8_e4m3 (emulated)"
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=6)
    results = eng.generate(PROMPTS, params)
    bf16 = engine(tiny_qwen3_dir).generate(PROMPTS, params)
    gaps = []
    for res, ref in zip(results, bf16):
        ids = torch.tensor([res.prompt_tokens + res.tokens[:-1]])
        with torch.no_grad():
            logits = eng.model(ids, attend=fp8_kv_attend)[0, len(res.prompt_tokens) - 1:].float()
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(res.tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(res.logprobs), want, atol=2e-5)
        gaps.append((torch.tensor(res.logprobs[:1]) - torch.tensor(ref.logprobs[:1])).abs().max())
    assert max(gaps) > 0  # the FP8 cache does change the numbers


def test_bad_budgets_are_refused_in_one_line(tiny_qwen3_dir):
    with pytest.raises(QuantrollError, match="holds 1 block.*raise --kv-cache-memory-gb"):
        small_budget(tiny_qwen3_dir, blocks=1).generate([[1, 2]], SamplingParams(max_new_tokens=2))
    with pytest.raises(QuantrollError, match="prompt 1 needs .* KV blocks.*--kv-cache-memory-gb"):
        small_budget(tiny_qwen3_dir, blocks=4).generate([[1], [1] * 20], SamplingParams(max_new_tokens=2))
    with pytest.raises(QuantrollError, match="must be > 0 GiB"):
        CacheConfig(memory_gb=0)
    with pytest.raises(QuantrollError, match="power of two"):
        CacheConfig(block_size=12)
    with pytest.raises(QuantrollError, match="unknown KV cache dtype"):
        CacheConfig(kv_cache_dtype="int8")
    with pytest.raises(QuantrollError, match=r"max_new_tokens\[1\] must be an integer in \[1, 4\]"):
        engine(tiny_qwen3_dir).generate([[1], [2]], SamplingParams(max_new_tokens=4), max_new_tokens=[2, 5])


def test_per_prompt_caps_end_each_sequence_at_its_own_length(tiny_qwen3_dir):
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=1, stop_token_ids=())
    eng = engine(tiny_qwen3_dir, decode_steps=8)
    capped = eng.generate(PROMPTS, params, max_new_tokens=[3, 12, 1, 7])
    full = eng.generate(PROMPTS, params)
    assert [len(r.tokens) for r in capped] == [3, 12, 1, 7]
    for c, f in zip(capped, full):
        assert c.tokens == f.tokens[: len(c.tokens)] and c.finish_reason == "length"


def test_table_rows_pad_with_the_scratch_block():
    """The decode chunk's block tables, built in one tensor: each sequence's table cut or padded
    to the width with the scratch block, and a graph bucket's padding rows all scratch."""
    from types import SimpleNamespace

    from quantroll.engine.block_manager import SCRATCH_BLOCK
    from quantroll.engine.model_runner import ModelRunner

    seqs = [SimpleNamespace(block_table=[4, 7]), SimpleNamespace(block_table=[1, 2, 3, 9])]
    rows = ModelRunner._table_rows(None, seqs, 3, 4)
    s = SCRATCH_BLOCK
    assert rows.dtype == torch.int32
    assert rows.tolist() == [[4, 7, s], [1, 2, 3], [s, s, s], [s, s, s]]
    assert ModelRunner._table_rows(None, seqs, 4).tolist() == [[4, 7, s, s], [1, 2, 3, 9]]


def test_a_row_past_its_cap_never_attends_beyond_its_table(tiny_qwen3_dir):
    """A decode chunk runs as long as its longest sequence; a row whose cap ends mid-chunk keeps
    computing (its tokens are thrown away) at positions past its cap, which at the model's full
    context lie past the block table's last column. The GPU kernels read the table without a
    bound, so the decode step hands them contexts clamped to what the table covers."""
    eng = engine(tiny_qwen3_dir, decode_steps=8)
    eng._ensure_cache()
    runner = eng._runner
    st = runner._state(2, SamplingParams(), 2)
    covered = runner.max_blocks * runner.block_size
    st.positions.copy_(torch.tensor([covered - 2, covered + 5]))  # in the table; 6 steps past a cap at its end
    st.limits.copy_(torch.tensor([covered - 1, covered - 3]))
    runner._step(st, SamplingParams())
    assert st.batch.context_lens.tolist() == [covered - 1, covered]

"""The paged attention kernels' indexing on a CPU, under Triton's interpreter (this file
run as a script, in float32 so the dots are exact enough to compare tightly): decode with
and without split-KV, prefill over cached prefixes with GQA and a head size that is not a
power of two, an FP8 cache's layout and scales, the decode store kernel, the output quantized for a
block-FP8 o_proj (test_fused_quant.check_decode_attention), the batch-invariant attention (engine side equal
to the trainer side, bit for bit), and a whole engine whose cache runs the kernels
against one that runs the reference. The device runs them compiled
(test_paged_attention_gpu.py); the interpreter cannot check FP8 bits."""

from __future__ import annotations

import dataclasses
import sys

import torch

from tests.interpreted import needs_new_interpreter, needs_triton, run_interpreted


@needs_triton
@needs_new_interpreter
def test_paged_kernels_under_the_interpreter():
    run_interpreted([__file__], "paged kernels ok", timeout=900)


def _cfg(heads, kv_heads, head_dim):
    from quantroll.bench.shapes import shape_config

    return dataclasses.replace(shape_config("qwen3-8b", 1), num_attention_heads=heads, num_key_value_heads=kv_heads,
                               head_dim=head_dim)


def _filled(cfg, contexts, block_size=16, seed=0, kv_dtype="bf16"):
    from quantroll.engine.paged_cache import AttentionBatch, PagedKVCache

    g = torch.Generator().manual_seed(seed)
    need = [-(-c // block_size) for c in contexts]
    num_blocks = sum(need) + 8
    cache = PagedKVCache(cfg, num_blocks, block_size, torch.float32, kv_dtype, "cpu", gpu_kernels=False)
    for t in cache.k + cache.v:
        if cache.quantized:
            t.view(torch.uint8).random_(0, 120, generator=g)  # finite codes: garbage beyond the keys must not matter
        else:
            t.normal_()  # garbage beyond each sequence's keys must not matter
    order = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    table = torch.zeros(len(contexts), max(need), dtype=torch.int32)
    slots, at = [], 0
    for i, (n, c) in enumerate(zip(need, contexts)):
        blocks = order[at: at + n]
        at += n
        table[i, :n] = torch.tensor(blocks, dtype=torch.int32)
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(c)]
    cache.batch = AttentionBatch(torch.tensor(slots), table, torch.tensor(contexts, dtype=torch.int32), None)
    kv = cfg.num_key_value_heads, cfg.head_dim
    cache.write(0, torch.randn(len(slots), *kv, generator=g), torch.randn(len(slots), *kv, generator=g))
    return cache, table


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def check_decode() -> None:
    from quantroll.engine.paged_cache import AttentionBatch
    from quantroll.kernels import paged_attention

    for splits in (1, 4):
        tiles = paged_attention.PagedTiles(decode_block_s=16, max_splits=splits)
        for contexts in ([1], [3, 97], [1, 17, 300, 33]):
            cache, table = _filled(_cfg(8, 2, 32), contexts)
            b = len(contexts)
            q = torch.randn(b, 8, 32)
            cache.batch = AttentionBatch(torch.zeros(b, dtype=torch.long), table,
                                         torch.tensor(contexts, dtype=torch.int32), None, max_context=max(contexts))
            got = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits)
            err = _rel(got, cache.reference_attend(0, q))
            assert err < 1e-5, (splits, contexts, err)


def check_prefill() -> None:
    from quantroll.engine.paged_cache import AttentionBatch
    from quantroll.kernels import paged_attention

    for heads, kv_heads, head_dim in ((8, 2, 32), (6, 2, 24)):
        q_lens, contexts = [20, 7, 1], [20, 40, 101]  # a fresh prompt, a chunk after 33 cached, one after 100
        cache, table = _filled(_cfg(heads, kv_heads, head_dim), contexts)
        starts = torch.tensor([0, 20, 27, 28], dtype=torch.int32)
        q = torch.randn(sum(q_lens), heads, head_dim)
        cache.batch = AttentionBatch(torch.zeros(28, dtype=torch.long), table, torch.tensor(contexts, dtype=torch.int32),
                                     starts, max_query=20, max_context=101)
        tiles = paged_attention.PagedTiles(prefill_block_m=16, prefill_block_n=16)
        got = paged_attention.prefill_attention(q, cache, 0, cache.batch, tiles)
        err = _rel(got, cache.reference_attend(0, q))
        assert err < 1e-5, (heads, head_dim, err)


def check_engine() -> None:
    """A CPU engine whose cache runs the kernels (decode through the store kernel) against
    one that runs the reference: same tokens, logprobs to float32 rounding, with chunked
    prefill, prefix sharing and preemption in play."""
    from quantroll.bench.shapes import random_model, shape_config
    from quantroll.engine import CacheConfig, Engine, SamplingParams, SchedulerConfig

    cfg = dataclasses.replace(shape_config("qwen3-8b", 2), hidden_size=256, intermediate_size=512,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512)
    model = random_model(cfg, "cpu").float()
    prompts = [list(range(3 + i, 30 + 2 * i)) for i in range(3) for _ in range(2)]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(), seed=5)
    results = {}
    for kernels in (False, True):
        probe = Engine.from_model(model, None, "cpu", dtype=torch.float32)
        gib = 14 * probe._block_bytes() / 2**30
        engine = Engine.from_model(model, None, "cpu", dtype=torch.float32,
                                   cache=CacheConfig(block_size=4, memory_gb=gib * 4),
                                   scheduler=SchedulerConfig(max_num_batched_tokens=40, decode_steps=4))
        engine._ensure_cache()
        engine._kv.gpu_kernels = kernels
        results[kernels] = engine.generate(prompts, params)
        assert engine.last_stats["prefill_tokens_saved"] > 0
    for a, b in zip(results[False], results[True]):
        assert a.tokens == b.tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def check_fp8() -> None:
    """An FP8 cache (keys positions-major, values positions-minor, per-position scales):
    decode with and without splits, and prefill, against the reference's exact
    dequantization. The interpreter widens E4M3 its own way (not the GPU's bits), so the
    bound is loose; what it checks is the layout and the scales' indexing."""
    from quantroll.engine.paged_cache import AttentionBatch
    from quantroll.kernels import paged_attention

    for block_size in (16, 8):
        contexts = [3, 97, 300]
        cache, table = _filled(_cfg(8, 2, 32), contexts, block_size=block_size, kv_dtype="fp8_e4m3")
        assert cache.values_positions_minor
        b = len(contexts)
        q = torch.randn(b, 8, 32)
        cache.batch = AttentionBatch(torch.zeros(b, dtype=torch.long), table, torch.tensor(contexts, dtype=torch.int32),
                                     None, max_context=max(contexts))
        for splits in (1, 3):
            tiles = paged_attention.PagedTiles(decode_block_s=32, max_splits=splits)
            got = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits)
            err = _rel(got, cache.reference_attend(0, q))
            assert err < 1e-2, (block_size, splits, err)
        starts = torch.tensor([0, 3, 43, 63], dtype=torch.int32)  # all of seq 0, the last 40 of 1, the last 20 of 2
        qp = torch.randn(63, 8, 32)
        cache.batch = AttentionBatch(torch.zeros(63, dtype=torch.long), table, torch.tensor(contexts, dtype=torch.int32),
                                     starts, max_query=40, max_context=300)
        tiles = paged_attention.PagedTiles(prefill_block_m=16, prefill_block_n=32)
        err = _rel(paged_attention.prefill_attention(qp, cache, 0, cache.batch, tiles), cache.reference_attend(0, qp))
        assert err < 1e-2, (block_size, err)


def check_invariant() -> None:
    """The true-on-policy attention: a query's output from the engine's side (a decode step
    among other sequences, or a row of a prefill chunk after a cached prefix) is the same
    bits as from the trainer's side (its whole sequence, contiguous), and both are the
    attention (against the reference, float32 rounding)."""
    from quantroll.engine.paged_cache import AttentionBatch
    from quantroll.kernels import paged_attention
    from quantroll.model.kernel_config import INVARIANT_KERNELS
    from quantroll.model.layers import causal_attend

    tiles = INVARIANT_KERNELS.invariant_attention
    heads, kv_heads, dim = 8, 2, 32
    lengths = [5, 70, 131]
    cache, table = _filled(_cfg(heads, kv_heads, dim), lengths)
    length = max(lengths)
    q = torch.randn(len(lengths), length, heads, dim)
    k = torch.zeros(len(lengths), length, kv_heads, dim)
    v = torch.zeros_like(k)
    flat = (-1, kv_heads, dim)
    for i, n in enumerate(lengths):  # the trainer's padded batch holds what the cache holds
        slots = (table[i, (torch.arange(n) // 16)].long() * 16 + torch.arange(n) % 16)
        k[i, :n], v[i, :n] = cache.k[0].view(flat)[slots], cache.v[0].view(flat)[slots]
    trainer = paged_attention.invariant_causal_attention(q, k, v, tiles)
    want = causal_attend(0, q, k, v)
    for i, n in enumerate(lengths):
        assert _rel(trainer[i, :n], want[i, :n]) < 1e-5
    # decode: every sequence's query at its position p sees keys 0 .. p; a batch of all three, then alone
    for rows in ([0, 1, 2], [2], [1]):
        ctx = torch.tensor([lengths[i] for i in rows], dtype=torch.int32)
        batch = AttentionBatch(torch.zeros(len(rows), dtype=torch.long), table[rows], ctx, None,
                               max_context=int(ctx.max()))
        got = paged_attention.invariant_attention(q[rows, ctx.long() - 1].clone(), cache, 0, batch, tiles)
        for j, i in enumerate(rows):
            assert torch.equal(got[j], trainer[i, lengths[i] - 1]), (rows, i)
    # a prefill chunk: the last 40 queries of sequence 2, after 91 cached positions, beside all 5 of sequence 0
    starts = torch.tensor([0, 5, 45], dtype=torch.int32)
    chunk = torch.cat([q[0, :5], q[2, 91:131]])
    batch = AttentionBatch(torch.zeros(45, dtype=torch.long), table[[0, 2]], torch.tensor([5, 131], dtype=torch.int32),
                           starts, max_query=40, max_context=131)
    got = paged_attention.invariant_attention(chunk, cache, 0, batch, tiles)
    assert torch.equal(got[:5], trainer[0, :5])
    assert torch.equal(got[5:], trainer[2, 91:131])


if __name__ == "__main__":
    torch.manual_seed(0)
    check_decode()
    check_prefill()
    check_fp8()
    check_invariant()
    check_engine()
    from tests.engine.test_fused_quant import check_decode_attention

    check_decode_attention("cpu")  # the output handed to a block-FP8 o_proj already quantized
    print("paged kernels ok")
    sys.exit(0)

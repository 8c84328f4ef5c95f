"""The paged attention kernels' indexing on a CPU, under Triton's interpreter (this file
run as a script, in float32 so the dots are exact enough to compare tightly): decode with
and without split-KV, prefill over cached prefixes with GQA and a head size that is not a
power of two, the decode store kernel, and a whole engine whose cache runs the kernels
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


def _filled(cfg, contexts, block_size=16, seed=0):
    from quantroll.engine.paged_cache import AttentionBatch, PagedKVCache

    g = torch.Generator().manual_seed(seed)
    need = [-(-c // block_size) for c in contexts]
    num_blocks = sum(need) + 8
    cache = PagedKVCache(cfg, num_blocks, block_size, torch.float32, "bf16", "cpu", gpu_kernels=False)
    for t in cache.k + cache.v:
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


if __name__ == "__main__":
    torch.manual_seed(0)
    check_decode()
    check_prefill()
    check_engine()
    print("paged kernels ok")
    sys.exit(0)

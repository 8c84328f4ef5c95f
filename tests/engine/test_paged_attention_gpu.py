"""The paged attention kernels against the reference path (PagedKVCache.reference_attend)
on long and ragged contexts through scattered block tables, split-KV included, BF16 and
FP8 caches; the decode store kernel against the model's own ops; and the engine's CUDA
graphs across buckets and weight loads. Run on the device (skipped without CUDA)."""

import dataclasses
import itertools

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
triton = pytest.importorskip("triton")

from quantroll.bench.shapes import random_model, shape_config  # noqa: E402
from quantroll.engine import CacheConfig, Engine, SamplingParams  # noqa: E402
from quantroll.engine.paged_cache import AttentionBatch, PagedKVCache  # noqa: E402
from quantroll.formats.kv_fp8 import quantize_kv  # noqa: E402
from quantroll.kernels import cuda_jit, paged_attention  # noqa: E402
from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS  # noqa: E402

DEV = "cuda"


def _cfg(heads=32, kv_heads=8, head_dim=128):
    cfg = shape_config("qwen3-8b", 1)
    return dataclasses.replace(cfg, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)


def _filled_cache(cfg, kv_dtype, contexts, block_size=16, seed=0, stale_byte=None):
    """A pool with every sequence's keys written at scattered blocks, and their tables;
    ``stale_byte``: what every byte held before (as a freed block keeps it)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-c // block_size) for c in contexts]
    num_blocks = sum(need) + 8
    cache = PagedKVCache(cfg, num_blocks, block_size, torch.bfloat16, kv_dtype, DEV, gpu_kernels=True)
    if stale_byte is not None:
        for t in cache.k + cache.v:
            t.view(torch.uint8).fill_(stale_byte)
        for t in cache.k_scale + cache.v_scale:
            t.fill_(float("nan"))
    order = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(order[at: at + n])
        at += n
    width = max(need)
    table_t = torch.zeros(len(contexts), width, dtype=torch.int32)
    slots = []
    for i, (t, c) in enumerate(zip(tables, contexts)):
        table_t[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        slots += [t[p // block_size] * block_size + p % block_size for p in range(c)]
    slots = torch.tensor(slots, device=DEV)
    n = len(slots)
    cache.batch = AttentionBatch(slots, table_t.to(DEV), torch.tensor(contexts, dtype=torch.int32, device=DEV), None)
    k = torch.randn(n, cfg.num_key_value_heads, cfg.head_dim, generator=g).to(DEV, torch.bfloat16)
    v = torch.randn(n, cfg.num_key_value_heads, cfg.head_dim, generator=g).to(DEV, torch.bfloat16)
    cache.write(0, k, v)
    return cache, table_t.to(DEV)


def _rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("tiles", [None, paged_attention.PagedTiles(decode_block_s=64, decode_stages=2),
                                   paged_attention.PagedTiles(decode_block_s=128, decode_stages=2)],
                         ids=["default", "bs64", "bs128"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("contexts", [[1], [8191], [3, 4097], [1, 17, 300, 2049, 33, 64, 65, 5000]])
def test_paged_decode_matches_the_reference(kv_dtype, contexts, tiles):
    cfg = _cfg()
    cache, tables = _filled_cache(cfg, kv_dtype, contexts)
    b = len(contexts)
    q = torch.randn(b, cfg.num_attention_heads, cfg.head_dim, device=DEV, dtype=torch.bfloat16)
    ctx = torch.tensor(contexts, dtype=torch.int32, device=DEV)
    cache.batch = AttentionBatch(torch.zeros(b, dtype=torch.long, device=DEV), tables, ctx, None,
                                 max_context=max(contexts))
    got = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles)
    ref = cache.reference_attend(0, q.float()).to(torch.bfloat16)  # float32 attention over the same cache
    assert _rel_err(got, ref) < 1e-2, _rel_err(got, ref)  # P rounded to bf16 for the PV dot


CUDA_DECODE = cuda_jit.unavailable_reason() is None
needs_cuda_decode = pytest.mark.skipif(not CUDA_DECODE, reason=f"CUDA kernels: {cuda_jit.unavailable_reason()}")


def _fp8_decode_batch(heads: int, kv_heads: int, contexts: list[int]):
    """An FP8 cache filled for ``contexts`` (one sequence each) with its decode batch set, and
    random BF16 queries of head_dim 128."""
    cache, tables = _filled_cache(_cfg(heads, kv_heads, 128), "fp8_e4m3", contexts)
    b = len(contexts)
    ctx = torch.tensor(contexts, dtype=torch.int32, device=DEV)
    cache.batch = AttentionBatch(torch.zeros(b, dtype=torch.long, device=DEV), tables, ctx, None,
                                 max_context=max(contexts))
    return cache, torch.randn(b, heads, 128, device=DEV, dtype=torch.bfloat16)


@needs_cuda_decode
@pytest.mark.parametrize("heads,kv_heads", [(32, 8), (16, 8), (28, 4), (12, 2), (8, 8), (64, 4)],
                         ids=["group4", "group2", "group7", "group6", "group1", "group16"])
@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("contexts", [[1], [31, 33], [1, 17, 300, 2049, 33, 64, 65, 5000]])
def test_cuda_fp8_decode_matches_the_reference_and_the_triton_kernel(heads, kv_heads, splits, contexts):
    """The CUDA FP8-cache decode kernel (paged_decode_cuda.py) against float32 attention over
    the same dequantized cache, and against the Triton kernel (both round q and P' to
    float16; their sums run in other orders): GQA groups 1-16, partial chunks and blocks,
    one split (its own output) and several (the Triton merge)."""
    cache, q = _fp8_decode_batch(heads, kv_heads, contexts)
    got = paged_attention.decode_attention(q, cache, 0, cache.batch, paged_attention.PagedTiles(decode_kernel="cuda"),
                                           splits=splits)
    ref = cache.reference_attend(0, q.float()).to(torch.bfloat16)
    assert _rel_err(got, ref) < 1e-2, _rel_err(got, ref)
    triton = paged_attention.decode_attention(q, cache, 0, cache.batch, DEFAULT_ENGINE_KERNELS.attention_fp8_triton,
                                              splits=splits)
    assert _rel_err(got, triton) < 5e-3, _rel_err(got, triton)
    by_rule = paged_attention.decode_attention(q, cache, 0, cache.batch)  # the engine's default: warps by its rule
    assert _rel_err(by_rule, ref) < 1e-2, _rel_err(by_rule, ref)


@needs_cuda_decode
@pytest.mark.parametrize("heads,kv_heads", [(64, 4), (28, 4)], ids=["group16", "group7"])
def test_cuda_fp8_decode_in_many_splits(heads, kv_heads):
    """16 splits on 2 warps, groups of 16 and 7, empty splits included (a context of 1):
    against float32 attention and one split, and the quantized output (the merge's) against
    quantizing its own BF16 output."""
    from quantroll.kernels.fp8_linear import quantize_activation_fp8

    cache, q = _fp8_decode_batch(heads, kv_heads, [1, 700, 2049, 40])
    b = q.shape[0]
    tiles = paged_attention.PagedTiles(decode_kernel="cuda", decode_warps=2)
    got = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=16)
    ref = cache.reference_attend(0, q.float()).to(torch.bfloat16)
    assert _rel_err(got, ref) < 1e-2, _rel_err(got, ref)
    one_split = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=1)
    assert _rel_err(got, one_split) < 5e-3, _rel_err(got, one_split)
    act = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=16, quantize=True)
    codes, scales = quantize_activation_fp8(got.reshape(b, heads * 128))
    assert torch.equal(act.codes.view(torch.uint8), codes.view(torch.uint8)) and torch.equal(act.scales, scales)


@needs_cuda_decode
def test_cuda_fp8_decode_refuses_what_it_cannot_read_and_quantizes_for_o_proj():
    """A BF16 cache or heads of 64 are refused with the reason (no silent Triton fall back);
    the quantized output (one split: the kernel's own; several: the merge's) equals
    quantize_activation_fp8 of the BF16 result; the CUDA-graph replay equals eager."""
    from quantroll.kernels.fp8_linear import quantize_activation_fp8

    tiles = paged_attention.PagedTiles(decode_kernel="cuda")
    for kv_dtype, head_dim, match in (("bf16", 128, "FP8"), ("fp8_e4m3", 64, "head_dim 128")):
        cfg = _cfg(8, 2, head_dim)
        cache, tables = _filled_cache(cfg, kv_dtype, [5])
        cache.batch = AttentionBatch(torch.zeros(1, dtype=torch.long, device=DEV), tables,
                                     torch.tensor([5], dtype=torch.int32, device=DEV), None, max_context=5)
        q = torch.randn(1, 8, head_dim, device=DEV, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=match):
            paged_attention.decode_attention(q, cache, 0, cache.batch, tiles)
    cfg = _cfg()
    contexts = [7, 300, 4100]
    cache, tables = _filled_cache(cfg, "fp8_e4m3", contexts)
    ctx = torch.tensor(contexts, dtype=torch.int32, device=DEV)
    cache.batch = AttentionBatch(torch.zeros(3, dtype=torch.long, device=DEV), tables, ctx, None,
                                 max_context=max(contexts))
    q = torch.randn(3, 32, 128, device=DEV, dtype=torch.bfloat16)
    for splits in (1, 4):
        y = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits)
        act = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits, quantize=True)
        codes, scales = quantize_activation_fp8(y.reshape(3, 32 * 128))
        assert torch.equal(act.codes.view(torch.uint8), codes.view(torch.uint8)) and torch.equal(act.scales, scales)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            replayed = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits)
        replayed.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, y), splits


def test_fp8_cache_ignores_stale_codes_and_scales_past_each_sequence():
    """Every code byte of the pool 448 (0x7E, the largest) and every scale NaN before the
    sequences' keys are written, as freed blocks keep what they held (never a NaN code: the
    stores write none, test_stores_never_write_a_nan_code): decode (with and without splits)
    and prefill read whole value blocks, so the codes past each sequence's length, and the
    scratch block's, must meet zero probabilities, and their scales must not be read."""
    cfg = _cfg()
    contexts = [1, 17, 300, 33]
    cache, tables = _filled_cache(cfg, "fp8_e4m3", contexts, stale_byte=0x7E)
    b = len(contexts)
    q = torch.randn(b, cfg.num_attention_heads, cfg.head_dim, device=DEV, dtype=torch.bfloat16)
    ctx = torch.tensor(contexts, dtype=torch.int32, device=DEV)
    cache.batch = AttentionBatch(torch.zeros(b, dtype=torch.long, device=DEV), tables, ctx, None,
                                 max_context=max(contexts))
    ref = cache.reference_attend(0, q.float()).to(torch.bfloat16)  # gathers the written positions only
    kernels = [paged_attention.PagedTiles()] + ([paged_attention.PagedTiles(decode_kernel="cuda")] if CUDA_DECODE else [])
    for splits, tiles in itertools.product((1, 4), kernels):
        got = paged_attention.decode_attention(q, cache, 0, cache.batch, tiles, splits=splits)
        assert torch.isfinite(got).all() and _rel_err(got, ref) < 1e-2, (splits, tiles.decode_kernel)
    starts = torch.arange(b + 1, dtype=torch.int32, device=DEV)
    cache.batch = AttentionBatch(torch.zeros(b, dtype=torch.long, device=DEV), tables, ctx, starts, max_query=1,
                                 max_context=max(contexts))
    got = paged_attention.prefill_attention(q, cache, 0, cache.batch)
    assert torch.isfinite(got).all() and _rel_err(got, ref) < 1e-2


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(32, 8, 128), (6, 2, 96), (4, 4, 64)])
def test_paged_prefill_matches_the_reference(kv_dtype, heads, kv_heads, head_dim):
    """Three sequences: a fresh prompt, a chunk after a cached prefix of 130 positions, and
    one token after 1000 (a recomputed tail): ragged queries over scattered blocks."""
    cfg = _cfg(heads, kv_heads, head_dim)
    q_lens, contexts = [200, 70, 1], [200, 200, 1001]
    cache, tables = _filled_cache(cfg, kv_dtype, contexts)
    starts = torch.tensor([0, 200, 270, 271], dtype=torch.int32, device=DEV)
    q = torch.randn(sum(q_lens), heads, head_dim, device=DEV, dtype=torch.bfloat16)
    cache.batch = AttentionBatch(torch.zeros(sum(q_lens), dtype=torch.long, device=DEV), tables,
                                 torch.tensor(contexts, dtype=torch.int32, device=DEV), starts, max_query=200,
                                 max_context=max(contexts))
    got = paged_attention.prefill_attention(q, cache, 0, cache.batch)
    ref = cache.reference_attend(0, q.float())
    for a, b in ((0, 200), (200, 270), (270, 271)):
        assert _rel_err(got[a:b], ref[a:b]) < 1e-2, (a, _rel_err(got[a:b], ref[a:b]))


def _store_only(qkv, qn, kn, cos, sin, cache):
    """decode_from_qkv's store kernel alone (its attention replaced): returns the queries."""
    q_out = []

    def grab(q, *_, **__):
        q_out.append(q)
        return q
    orig = paged_attention.decode_attention
    paged_attention.decode_attention = grab
    try:
        paged_attention.decode_from_qkv(qkv, qn.weight, kn.weight, 1e-6, cos, sin, cache, 0, cache.batch)
    finally:
        paged_attention.decode_attention = orig
    return q_out[0]


def test_stores_never_write_a_nan_code():
    """A NaN value element, through the decode store kernel and through the prefill's
    cache.write, is stored as code 0; the E4M3 NaN bytes 0x7F / 0xFF never enter the pool,
    which the whole-block value loads rely on."""
    from quantroll.model.layers import RMSNorm

    cfg = _cfg(8, 2, 128)
    heads, kv, dim, b = 8, 2, 128, 3
    qkv = torch.randn(b, (heads + 2 * kv) * dim, device=DEV, dtype=torch.bfloat16)
    qkv[1, (heads + kv) * dim + 5] = float("nan")  # one value element of sequence 1
    norm = RMSNorm(dim, 1e-6, torch.bfloat16, DEV)
    cos = torch.ones(b, 1, dim, device=DEV, dtype=torch.bfloat16)
    sin = torch.zeros(b, 1, dim, device=DEV, dtype=torch.bfloat16)
    slots = torch.tensor([5, 40, 17], device=DEV)
    for write in ("kernel", "torch"):
        cache = PagedKVCache(cfg, 4, 16, torch.bfloat16, "fp8_e4m3", DEV, gpu_kernels=True)
        cache.batch = AttentionBatch(slots, torch.tensor([[1, 2, 3]] * b, dtype=torch.int32, device=DEV),
                                     torch.tensor([4, 18, 40], dtype=torch.int32, device=DEV), None)
        if write == "kernel":
            _store_only(qkv, norm, norm, cos, sin, cache)
        else:
            v = qkv[:, (heads + kv) * dim:].reshape(b, kv, dim)
            cache.write(0, torch.zeros_like(v), v)
        codes = cache.v[0].view(torch.uint8)
        assert not ((codes & 0x7F) == 0x7F).any(), write
        assert codes[slots[1] // 16, 0, 5, slots[1] % 16] == 0, write


def test_store_kernel_matches_the_model_ops_and_quantizes_like_the_reference():
    from quantroll.model.layers import RMSNorm
    from quantroll.model.rope import apply_rotary

    torch.manual_seed(0)
    cfg = _cfg(8, 2, 128)
    heads, kv, dim, b = 8, 2, 128, 3
    qkv = torch.randn(b, (heads + 2 * kv) * dim, device=DEV, dtype=torch.bfloat16)
    qn, kn = RMSNorm(dim, 1e-6, torch.bfloat16, DEV), RMSNorm(dim, 1e-6, torch.bfloat16, DEV)
    qn.weight.data.normal_(1, 0.1)
    kn.weight.data.normal_(1, 0.1)
    pos = torch.tensor([3, 17, 39], device=DEV)
    ang = pos[:, None].float() * (1e6 ** (-torch.arange(0, dim, 2, device=DEV).float() / dim))
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().to(torch.bfloat16)[:, None], emb.sin().to(torch.bfloat16)[:, None]
    slots = torch.tensor([5, 40, 17], device=DEV)
    caches = {}
    for kv_dtype in ("bf16", "fp8_e4m3"):
        cache = PagedKVCache(cfg, 4, 16, torch.bfloat16, kv_dtype, DEV, gpu_kernels=True)
        cache.batch = AttentionBatch(slots, torch.tensor([[1, 2, 3]] * b, dtype=torch.int32, device=DEV),
                                     (pos + 1).to(torch.int32), None)
        caches[kv_dtype] = (cache, _store_only(qkv, qn, kn, cos, sin, cache))
    qr, kr, vr = qkv.split([heads * dim, kv * dim, kv * dim], -1)
    q_ref = apply_rotary(qn(qr.view(b, 1, heads, dim)), cos, sin)[:, 0]
    k_ref = apply_rotary(kn(kr.view(b, 1, kv, dim)), cos, sin)[:, 0]
    bf16, q = caches["bf16"]
    scale = q_ref.float().abs().max().item()
    assert (q.float() - q_ref.float()).abs().max().item() <= 2**-6 * scale
    k_got = bf16.k[0].view(-1, kv, dim)[slots]
    assert (k_got.float() - k_ref.float()).abs().max().item() <= 2**-6 * scale
    assert torch.equal(bf16.v[0].view(-1, kv, dim)[slots], vr.view(b, kv, dim))
    fp8, _ = caches["fp8_e4m3"]
    codes, scales = quantize_kv(k_got)  # the FP8 store quantizes exactly the values the BF16 store writes
    assert torch.equal(fp8.k[0].view(-1, kv, dim)[slots].view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(fp8.scales_at(fp8.k_scale[0], slots), scales)
    v_codes, v_scales = quantize_kv(vr.view(b, kv, dim))
    v_stored = fp8.v[0].view(torch.uint8)[slots // 16, :, :, slots % 16]  # values positions-minor in an FP8 cache
    assert torch.equal(v_stored, v_codes.view(torch.uint8))
    assert torch.equal(fp8.scales_at(fp8.v_scale[0], slots), v_scales)


def _small(shape="qwen3-8b"):
    return dataclasses.replace(shape_config(shape, 2), vocab_size=4096)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_graphs_across_buckets_and_weight_loads_equal_eager(kv_dtype):
    """20 sequences with caps from 1 to 60 tokens: the running set shrinks through the 32,
    16, 8, 4, 2 and 1 buckets, each captured once and reused by the second call; after
    load_weights the graphs compute with the new weights."""
    cfg = _small()
    model = random_model(cfg, DEV)
    cache = CacheConfig(kv_cache_dtype=kv_dtype, memory_gb=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=60, stop_token_ids=(), seed=3)
    prompts = [list(range(1 + i, 9 + 3 * i)) for i in range(20)]
    caps = [1 + (i * 59) // 19 for i in range(20)]
    eager = Engine.from_model(model, None, DEV, cuda_graphs=False, cache=cache).generate(prompts, params, caps)
    graph_engine = Engine.from_model(model, None, DEV, cache=cache)
    graph = graph_engine.generate(prompts, params, caps)
    captures = graph_engine.last_stats["graph_captures"]
    assert captures >= 5
    again = graph_engine.generate(prompts, params, caps)
    assert graph_engine.last_stats["graph_captures"] == captures
    agree = []
    for a, b, c in zip(eager, graph, again):
        assert b.tokens == c.tokens and b.logprobs == c.logprobs  # a replay is bit for bit the first run
        # eager runs each batch at its own row count, graphs at the bucket's (other GEMM tiles): the same
        # samples until a near-tie of the random model flips
        n = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), len(a.tokens))
        assert n >= 1 and a.logprobs[:n] == pytest.approx(b.logprobs[:n], abs=5e-2)
        agree.append(n / len(a.tokens))
    assert sum(agree) / len(agree) > 0.5, agree
    new = {n: p.detach() * 1.25 for n, p in model.named_parameters()}
    graph_engine.load_weights(new.items())
    after = graph_engine.generate(prompts, params, caps)
    assert graph_engine.last_stats["graph_captures"] == captures  # the same graphs, replayed on the new weights
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(new[name])
    fresh = Engine.from_model(model, None, DEV, cache=cache).generate(prompts, params, caps)
    assert [r.tokens for r in after] == [r.tokens for r in fresh] != [r.tokens for r in graph]
    assert [r.logprobs for r in after] == [r.logprobs for r in fresh]


def _full_forward_errors(engine, results):
    """|reported logprob - the logprob of one full causal forward over the sequence's own
    tokens| per sampled token: a resumed sequence whose recomputed or shared KV were wrong
    would be far off at every token after the fault, whatever it sampled."""
    import torch.nn.functional as F

    def attend(layer, q, k, v):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True, enable_gqa=True)
        return out.transpose(1, 2)

    errors = []
    for res in results:
        ids = torch.tensor([res.prompt_tokens + res.tokens[:-1]], device=DEV)
        with torch.no_grad():
            logits = engine.model(ids, attend=attend)[0, len(res.prompt_tokens) - 1:].float()
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(res.tokens, device=DEV)[:, None])[:, 0].cpu()
        errors.append((torch.tensor(res.logprobs) - want).abs())
    return torch.cat(errors)


def test_gpu_engine_preempts_and_shares_without_changing_samples():
    cfg = _small()
    model = random_model(cfg, DEV)
    params = SamplingParams(temperature=1.0, max_new_tokens=96, stop_token_ids=(), seed=8)
    prompts = [list(range(3 + i, 40 + i)) for i in range(6) for _ in range(4)]  # 6 prompts x 4 samples
    free_engine = Engine.from_model(model, None, DEV, cache=CacheConfig(memory_gb=2))
    free = free_engine.generate(prompts, params)
    probe = Engine.from_model(model, None, DEV)
    gib = 40 * probe._block_bytes() / 2**30  # 39 blocks of 16 positions for 24 sequences of up to 132
    tight = Engine.from_model(model, None, DEV, cache=CacheConfig(memory_gb=gib))
    got = tight.generate(prompts, params)
    assert tight.last_stats["preemptions"] > 0 and tight.last_stats["prefill_tokens_saved"] > 0
    for a, b in zip(got, free):
        n = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), len(a.tokens))
        assert n >= 8, n  # the same until batch-dependent rounding flips a near-tie
        assert a.logprobs[:n] == pytest.approx(b.logprobs[:n], abs=5e-2)
    # after a flip the samples differ, so the resumed sequences are judged against a full forward
    # of their own tokens, beside the unpreempted run judged the same way
    tight_err, free_err = _full_forward_errors(tight, got), _full_forward_errors(free_engine, free)
    assert tight_err.max() < 0.25 and tight_err.mean() <= 1.5 * free_err.mean() + 1e-3, (tight_err, free_err)


def test_fp8_kv_gpu_engine_is_as_close_to_its_reference_as_the_bf16_engine_to_its():
    """The FP8-KV engine's logprobs against one full forward whose attention quantizes keys
    and values the same way, next to the BF16 engine against a plain forward: decode and
    full-forward kernels round differently in both; the FP8 cache must add no error of its
    own beyond that (a random model amplifies every rounding difference, so the criterion
    is relative)."""
    import torch.nn.functional as F

    from quantroll.formats.kv_fp8 import dequantize_kv

    def attend(quantize):
        def fn(layer, q, k, v):
            if quantize:
                k, v = (dequantize_kv(*quantize_kv(t)).to(t.dtype) for t in (k, v))
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=True)
            return out.transpose(1, 2)
        return fn

    model = random_model(_small(), DEV)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, stop_token_ids=(), seed=4)
    errors = {}
    for kv_dtype in ("bf16", "fp8_e4m3"):
        engine = Engine.from_model(model, None, DEV, cache=CacheConfig(kv_cache_dtype=kv_dtype, memory_gb=1))
        diffs = []
        for res in engine.generate([list(range(5, 60)), [9, 8, 7]], params):
            ids = torch.tensor([res.prompt_tokens + res.tokens[:-1]], device=DEV)
            with torch.no_grad():
                logits = engine.model(ids, attend=attend(kv_dtype != "bf16"))[0, len(res.prompt_tokens) - 1:].float()
            want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(res.tokens, device=DEV)[:, None])[:, 0].cpu()
            diffs.append((torch.tensor(res.logprobs) - want).abs())
        errors[kv_dtype] = torch.cat(diffs).mean().item()
    assert engine.kv_cache_label == "fp8_e4m3"
    assert errors["fp8_e4m3"] <= 2 * errors["bf16"] + 1e-2, errors


def test_fp8_kv_block_larger_than_the_attention_tiles_is_refused_when_the_engine_is_built():
    """An FP8 cache's value tiles read whole blocks: a block size the tiles do not cover is
    refused up front, naming the flag (not at the first prefill, naming a tile)."""
    from quantroll.errors import QuantrollError

    model = random_model(_small(), DEV)
    with pytest.raises(QuantrollError, match="--kv-cache-block-size 128 with --kv-cache-dtype fp8_e4m3"):
        Engine.from_model(model, None, DEV, cache=CacheConfig(kv_cache_dtype="fp8_e4m3", block_size=128))
    Engine.from_model(model, None, DEV, cache=CacheConfig(kv_cache_dtype="fp8_e4m3", block_size=32))  # divides 64


def test_the_engine_decodes_an_fp8_cache_on_the_cuda_kernel_where_it_can(caplog):
    """Heads of 128 on a GPU with nvcc: the CUDA kernel, its warps by the rule (the driver's
    occupancy: more blocks of 2 warps resident than of 4); heads of 64: the Triton tiles, and
    the engine's log says why. Either engine samples the same tokens eagerly and replayed."""
    import logging

    from quantroll.kernels import paged_decode_cuda

    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(), seed=5)
    prompts = [list(range(3, 11)), list(range(20, 33))]
    for head_dim, want in ((128, "cuda" if CUDA_DECODE else "triton"), (64, "triton")):
        cfg = dataclasses.replace(_small(), head_dim=head_dim)
        model = random_model(cfg, DEV)
        with caplog.at_level(logging.INFO, logger="quantroll"):
            engine = Engine.from_model(model, None, DEV, cache=CacheConfig(kv_cache_dtype="fp8_e4m3", memory_gb=1))
        assert engine.kernels.gpu.attention_fp8.decode_kernel == want
        graph = engine.generate(prompts, params)
        eager = Engine.from_model(model, None, DEV, cuda_graphs=False,
                                  cache=CacheConfig(kv_cache_dtype="fp8_e4m3", memory_gb=1)).generate(prompts, params)
        assert [r.tokens[:1] for r in graph] == [r.tokens[:1] for r in eager]
        assert engine.last_stats["kernels"]["attention_fp8"]["decode_kernel"] == want
    assert "cannot serve: it is compiled for head_dim 128, the cache has 64" in caplog.text
    if CUDA_DECODE:
        slots = paged_decode_cuda._slots(torch.cuda.current_device())
        assert slots[2] >= slots[4] > 0, slots
        tiles = DEFAULT_ENGINE_KERNELS.attention_fp8
        assert paged_attention.decode_splits(16, 8, torch.device(DEV), tiles) >= 2  # 2 programs per SM
        assert paged_decode_cuda.warps_for(16 * 8 * 2, torch.device(DEV)) in paged_decode_cuda.WARPS

"""Launchers for the paged-attention kernels (paged_attention_triton.py) over a
``PagedKVCache`` and the ``AttentionBatch`` of one forward pass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from quantroll.errors import QuantrollError
from quantroll.kernels.fp8_activation import FP8_GROUP, Fp8Activation, fp8_activation_buffers
from quantroll.kernels.launch import next_pow2


@dataclass(frozen=True)
class PagedTiles:
    """Launch shapes: keys per decode tile, prefill query and key tiles, warps."""

    decode_block_s: int = 64
    decode_warps: int | None = 4  # None (the CUDA kernel only): by its rule per launch (paged_decode_cuda.warps_for)
    decode_stages: int = 3
    decode_kernel: str = "triton"  # or "cuda": paged_decode_cuda.py (FP8 caches; decode_warps 4, 2 or None; block_s
                                   # and stages unused)
    prefill_block_m: int = 64
    prefill_block_n: int = 64
    prefill_warps: int = 4
    max_splits: int = 16

    def __post_init__(self):
        if self.decode_kernel not in ("triton", "cuda"):
            raise ValueError(f"PagedTiles.decode_kernel must be 'triton' or 'cuda', got {self.decode_kernel!r}")
        if self.decode_warps is None and self.decode_kernel != "cuda":
            raise ValueError("PagedTiles.decode_warps None (chosen per batch) is the CUDA decode kernel's rule; the "
                             "Triton kernel takes a warp count")


def _tiles(cache) -> PagedTiles:
    """The cache's kernel choice for its dtype (KernelConfig.gpu, kernels/choices.py)."""
    return cache.kernels.gpu.attention_tiles(cache.quantized)


# (sequence, KV head, split) programs a decode launch aims at per SM. One program per SM
# leaves each SM with one stream of loads in flight: measured on an H100 (bench/paged_attention.py
# --shape qwen3-8b --splits 2,4,8, 2026-12-06), 16 sequences x 8 KV heads = 128 programs took
# 61.1 us (FP8, 2048 positions) and 420 us (16384) in one split, 40.0 and 232 us in four;
# 64 x 8 = 512 programs (~4 per SM) gained nothing from splits.
PROGRAMS_PER_SM = 4


def decode_splits(batch: int, kv_heads: int, device: torch.device, tiles: PagedTiles = PagedTiles()) -> int:
    """How many programs share one sequence's positions: enough for ``PROGRAMS_PER_SM``
    (sequence, KV head, split) programs per SM, the CUDA kernel's own target for its tiles
    (paged_decode_cuda.PROGRAMS_PER_SM), when the batch alone gives fewer; fixed per batch
    size, so that a captured graph keeps its grid as contexts grow."""
    if torch.device(device).type != "cuda":
        return 1  # Triton's interpreter
    if tiles.decode_kernel == "cuda":
        from quantroll.kernels.paged_decode_cuda import PROGRAMS_PER_SM as per_sm
    else:
        per_sm = PROGRAMS_PER_SM
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(tiles.max_splits, per_sm * sms // max(batch * kv_heads, 1)))


def _check_value_tiles(cache, keys_per_tile: int) -> None:
    """An FP8 cache's value tiles load whole blocks of contiguous positions (its pool is
    positions-minor): a tile must cover whole blocks."""
    if cache.values_positions_minor and keys_per_tile % cache.block_size:
        raise QuantrollError(f"paged attention: {keys_per_tile} keys per tile do not cover whole KV blocks of "
                             f"{cache.block_size} positions; use a multiple of the block size")


def _pools(cache, layer: int):
    k, v = cache.k[layer], cache.v[layer]
    ks = cache.k_scale[layer] if cache.quantized else k  # placeholders without scales (never read)
    vs = cache.v_scale[layer] if cache.quantized else v
    return k, v, ks, vs


def quantizes_output(head_dim: int) -> bool:
    """Whether decode_attention can hand o_proj its input as an Fp8Activation: each head
    must be exactly one 1x128 quantization group."""
    return head_dim == FP8_GROUP


def decode_attention(q: torch.Tensor, cache, layer: int, batch, tiles: PagedTiles | None = None,
                     splits: int | None = None, quantize: bool = False) -> torch.Tensor | Fp8Activation:
    """q [B, H, D] (one token per sequence) -> [B, H, D]; ``tiles`` default: the cache
    dtype's (EngineKernels.attention_tiles); ``splits`` default: decode_splits (the CUDA
    kernel's warps, where the tiles leave them open: paged_decode_cuda.warps_for). ``quantize``
    (where quantizes_output(D)): an Fp8Activation of shape [B, H * D] instead, bit for bit
    quantize_activation_fp8 of the BF16 result, for a block-FP8 o_proj (one launch fewer)."""
    tiles = tiles or _tiles(cache)
    b, h, d = q.shape
    hkv = cache.kv_heads
    _check_value_tiles(cache, tiles.decode_block_s)
    if quantize and not quantizes_output(d):
        raise ValueError(f"decode attention quantizes its output for heads of {FP8_GROUP} only, got head_dim {d}")
    if splits is None:
        splits = decode_splits(b, hkv, q.device, tiles)
    warps = tiles.decode_warps
    if tiles.decode_kernel == "cuda":
        _check_cuda(cache, q)
        if warps is None:
            from quantroll.kernels.paged_decode_cuda import warps_for

            warps = warps_for(b * hkv * splits, q.device)
    out = q if quantize else torch.empty_like(q)  # quantized: a placeholder the kernels never store to
    codes, scales = fp8_activation_buffers(b, h * d, q.device) if quantize else (out, out)
    k, v, ks, vs = _pools(cache, layer)
    if splits > 1:
        part_o = torch.empty(b, h, splits, d, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(b, h, splits, 2, dtype=torch.float32, device=q.device)
    else:
        part_o = part_ml = out  # placeholders (never stored to)
    if tiles.decode_kernel == "cuda":
        _launch_cuda(q, k, v, ks, vs, batch, out, part_o, part_ml, codes, scales, splits, quantize, warps)
    else:
        _launch_triton(q, k, v, ks, vs, batch, out, part_o, part_ml, codes, scales, splits, quantize, cache, tiles)
    if splits > 1:
        _merge_splits(part_o, part_ml, out, codes, scales, quantize)
    if quantize:
        return Fp8Activation(codes, scales, torch.Size([b, h * d]), q.dtype)
    return out


def _launch_triton(q, k, v, ks, vs, batch, out, part_o, part_ml, codes, scales, splits: int, quantize: bool, cache,
                   tiles: PagedTiles) -> None:
    """The Triton decode kernel: with one split it stores the output (quantized for o_proj
    where asked); with several, the splits' partials for _merge_splits."""
    from quantroll.kernels.paged_attention_triton import paged_decode_kernel

    b, h, d = q.shape
    hkv = cache.kv_heads
    group = h // hkv
    tables = batch.block_tables
    paged_decode_kernel[(b, hkv, splits)](
        q, k, v, ks, vs, tables, batch.context_lens, out, part_o, part_ml, codes, scales, d**-0.5,
        q.stride(0), q.stride(1), tables.stride(0), out.stride(0), out.stride(1), codes.stride(0), scales.stride(-1),
        HKV=hkv, D=d, D_PAD=next_pow2(d, 16), GROUP=group, G_PAD=next_pow2(group, 16), BLOCK_SIZE=cache.block_size,
        BLOCK_S=tiles.decode_block_s, SPLITS=splits, FP8=cache.quantized, IEEE=q.dtype == torch.float32,
        QUANT_OUT=quantize, num_warps=tiles.decode_warps,
        num_stages=tiles.decode_stages)


def _merge_splits(part_o, part_ml, out, codes, scales, quantize: bool) -> None:
    """Both decode kernels' splits merged (log-sum-exp weights) by one Triton launch, which
    stores the output, quantized for o_proj where asked. A second launch rather than a merge
    in the CUDA kernel's last block: see paged_decode_fp8.cu's header."""
    from quantroll.kernels.paged_attention_triton import merge_splits_kernel

    b, h, splits, d = part_o.shape
    merge_splits_kernel[(b, h)](part_o, part_ml, out, codes, scales, out.stride(0), out.stride(1), codes.stride(0),
                                scales.stride(-1), H=h, D=d, D_PAD=next_pow2(d, 16), SPLITS=splits,
                                S_PAD=next_pow2(splits, 2), QUANT_OUT=quantize)


def _check_cuda(cache, q) -> None:
    from quantroll.kernels.paged_decode_cuda import cache_unsupported_reason

    reason = cache_unsupported_reason(cache, q)
    if reason is not None:
        raise ValueError(f"decode_kernel 'cuda' cannot read this cache: {reason}")


def _launch_cuda(q, k, v, ks, vs, batch, out, part_o, part_ml, codes, scales, splits: int, quantize: bool,
                 warps: int) -> None:
    """The CUDA FP8-cache kernel: with one split it stores the output (quantized for o_proj
    where asked) itself; with several, the splits' partials for _merge_splits."""
    from quantroll.kernels import paged_decode_cuda

    own = quantize and splits == 1
    paged_decode_cuda.decode_fp8(q, k, v, ks, vs, batch.block_tables, batch.context_lens, out, part_o, part_ml, splits,
                                 warps=warps, codes=codes if own else None, code_scales=scales if own else None)


def prefill_attention(q: torch.Tensor, cache, layer: int, batch, tiles: PagedTiles | None = None) -> torch.Tensor:
    """q [N, H, D] (the flattened queries of the batch's sequences) -> [N, H, D]."""
    tiles = tiles or _tiles(cache)
    _check_value_tiles(cache, tiles.prefill_block_n)
    k, v, ks, vs = _pools(cache, layer)
    return _launch_prefill(q, k, v, ks, vs, batch.block_tables, batch.query_starts, batch.context_lens,
                           batch.max_query, cache.kv_heads, cache.block_size, cache.quantized, tiles)


def _launch_prefill(q, k, v, ks, vs, tables, query_starts, context_lens, max_query: int, hkv: int, block_size: int,
                    fp8: bool, tiles: PagedTiles) -> torch.Tensor:
    from quantroll.kernels.paged_attention_triton import paged_prefill_kernel

    n, h, d = q.shape
    out = torch.empty_like(q)
    grid = (tables.shape[0], -(-max_query // tiles.prefill_block_m), h)
    paged_prefill_kernel[grid](
        q, k, v, ks, vs, tables, query_starts, context_lens, out, d**-0.5,
        q.stride(0), q.stride(1), tables.stride(0), out.stride(0), out.stride(1),
        HKV=hkv, D=d, D_PAD=next_pow2(d, 16), GROUP=h // hkv, BLOCK_SIZE=block_size,
        BLOCK_M=tiles.prefill_block_m, BLOCK_N=tiles.prefill_block_n, FP8=fp8,
        IEEE=q.dtype == torch.float32, num_warps=tiles.prefill_warps, num_stages=2)
    return out


# -- batch-invariant attention (--true-on-policy-mode) -----------------------------------------
# Every query, a decode step's one token, a prefill chunk's or the trainer's whole sequence,
# goes through the prefill kernel with one fixed tile shape (KernelConfig.invariant_attention):
# its key tiles start at absolute position 0 whatever tile of queries it sits in, a row of an
# MMA depends on that row alone, and the tiles past a query's position are masked to exact
# zeros (p = 0, rescale 1). So the engine's logprob and the trainer's recomputation attend
# with the same bits, whatever else shares the batch and however the schedule cut it.
def invariant_attention(q: torch.Tensor, cache, layer: int, batch, tiles: PagedTiles) -> torch.Tensor:
    """The engine's side: the batch's queries [N, H, D] against the cache (BF16)."""
    if batch.query_starts is None:  # decode: one query per sequence
        starts = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
        batch = dataclasses.replace(batch, query_starts=starts, max_query=1)
    return prefill_attention(q, cache, layer, batch, tiles)


def invariant_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiles: PagedTiles,
                               block_size: int = 16) -> torch.Tensor:
    """The trainer's side: q [B, L, H, D], k/v [B, L, Hkv, D] (positions 0 .. L-1 in every
    row) -> [B, L, H, D], each row's keys laid out as consecutive blocks of a pool. Its block
    size need not be the engine cache's: BLOCK_SIZE only addresses keys, the tiles and every
    operation on them are the same."""
    b, length, h, d = q.shape
    hkv = k.shape[2]
    blocks = -(-length // block_size)
    pad = blocks * block_size - length

    def pool(x):
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) if pad else x
        return x.reshape(b * blocks, block_size, hkv, d).contiguous()

    kp, vp = pool(k), pool(v)
    tables = torch.arange(b * blocks, dtype=torch.int32, device=q.device).view(b, blocks)
    starts = torch.arange(b + 1, dtype=torch.int32, device=q.device) * length
    contexts = torch.full((b,), length, dtype=torch.int32, device=q.device)
    out = _launch_prefill(q.reshape(b * length, h, d).contiguous(), kp, vp, kp, vp, tables, starts, contexts, length,
                          hkv, block_size, False, tiles)
    return out.view(b, length, h, d)


def attend(q: torch.Tensor, cache, layer: int, batch) -> torch.Tensor:
    """The batch's queries [N, H, D] against the cache (its new keys already written)."""
    if batch.query_starts is None:
        return decode_attention(q.contiguous(), cache, layer, batch)
    return prefill_attention(q.contiguous(), cache, layer, batch)


def decode_from_qkv(qkv: torch.Tensor, q_norm_w, k_norm_w, eps: float, cos, sin, cache, layer: int, batch,
                    quantize: bool = False) -> torch.Tensor | Fp8Activation:
    """A decode step from the fused q/k/v projection [B, (H + 2 Hkv) D] (biases already
    added): the per-head QK-norms (none where ``q_norm_w`` is None: a family without them),
    rotary and the key/value store in one launch, then attention -> [B, H, D] (``quantize``:
    decode_attention's Fp8Activation for a block-FP8 o_proj)."""
    from quantroll.kernels.kv_store_triton import store_kv_kernel

    b = qkv.shape[0]
    h, hkv, d = cache.heads, cache.kv_heads, cache.head_dim
    q = torch.empty(b, h, d, dtype=qkv.dtype, device=qkv.device)
    cos2, sin2 = cos.reshape(b, -1), sin.reshape(b, -1)
    k, v, ks, vs = _pools(cache, layer)
    qk_norm = q_norm_w is not None
    store_kv_kernel[(b, h + hkv)](
        qkv, q_norm_w if qk_norm else qkv, k_norm_w if qk_norm else qkv, cos2, sin2, q, k, v, ks, vs, batch.slots,
        eps, qkv.stride(0), cos2.stride(0), q.stride(0), q.stride(1), HQ=h, HKV=hkv, D=d, FP8=cache.quantized,
        BLOCK_SIZE=cache.block_size, QK_NORM=qk_norm, num_warps=1)
    return decode_attention(q, cache, layer, batch, quantize=quantize)

"""Wrappers for the Triton decode-attention kernels (see decode_attention_triton.py)."""

from __future__ import annotations

import torch

from quantroll.kernels.counters import counters

# Decode from the fused q/k/v projection in one launch (decode_attention_qkv) instead of
# two (qk_norm_rope_cache + decode_attention), and hand a block-FP8 o_proj its input
# already quantized. Measured on the H200 (Qwen3-8B shape, 2026-12-01): 0.11-0.14 ms less
# per decode step at batch 16 and 64, BF16 and FP8 alike (docs/PERFORMANCE.md). Not
# bit-identical to the two launches on the GPU: Triton orders and contracts the q/k norm
# and rotary arithmetic of the two kernels differently (last bits of q and k); both sit
# the same distance from a float64 step (tests/engine/test_decode_attention_fused.py).
FUSE_QKV_ATTENTION = True
# Split each sequence's keys over several programs when a step has fewer (sequence, KV
# head) pairs than SMs (decode_attention_qkv's ``splits``; flash-decoding). Off: on the
# H200 (2026-12-01) it gives different tokens from one program per pair (mean |logprob
# difference| 0.72) although the interpreter agrees within 1e-5, cause not found, and it
# gained at most 1% of the 8B step (docs/PERFORMANCE.md). Not bit-identical to one program per pair
# (the softmax sums merge per split); held to a float64 step like the one-launch path.
# The split count follows the batch (pairs vs SMs), so with it on a sequence's last bits
# depend on how many sequences share its decode batch.
SPLIT_KV_ATTENTION = False
MAX_SPLITS = 16
_MAX_PAIRS = 1 << 16
PAIR_COUNTERS = "attention pairs"  # counters.py kind


def next_pow2(n: int, floor: int) -> int:
    """The smallest power of two >= n and >= floor (Triton block sizes)."""
    p = floor
    while p < n:
        p *= 2
    return p


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                     block_s: int = 64) -> torch.Tensor:
    """q [B, H, D]; caches [B, S, Hkv, D]; lengths [B] valid keys per row -> [B, H, D]."""
    from quantroll.kernels.decode_attention_triton import decode_attention_kernel

    b, h, d = q.shape
    hkv = k_cache.shape[2]
    group = h // hkv
    out = torch.empty_like(q)
    decode_attention_kernel[(b, hkv)](
        q, k_cache, v_cache, lengths, out, d**-0.5,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        HEAD_DIM=d, D_PAD=next_pow2(d, 16), GROUP=group, G_PAD=next_pow2(group, 16), BLOCK_S=block_s,
        num_warps=4, num_stages=2,
    )
    return out


def kv_splits(pairs: int, capacity: int, sms: int, block_s: int = 64) -> tuple[int, int]:
    """(splits, keys per split) for ``pairs`` (sequence, KV head) programs over a cache of
    ``capacity`` slots: enough splits for ~2 programs per SM, each a whole number of key
    blocks, at most MAX_SPLITS; (1, capacity) when the pairs alone fill the SMs. Fixed per
    cache (not per step), so a captured CUDA graph keeps its grid while sequences grow."""
    if pairs >= sms or capacity <= block_s:
        return 1, capacity
    splits = min(-(-2 * sms // pairs), -(-capacity // block_s), MAX_SPLITS)
    chunk = -(-capacity // (splits * block_s)) * block_s
    return -(-capacity // chunk), chunk


def fuses_qkv(head_dim: int) -> bool:
    """Head sizes the one-launch kernel reproduces bit for bit: powers of two from 16 (the
    dot's smallest K) to 128 (beyond it, the RMS sums of the q/k norm kernel add more than
    two elements per lane, an order _sum_squares does not spell out)."""
    return 16 <= head_dim <= 128 and head_dim & (head_dim - 1) == 0


def decode_attention_qkv(qkv: torch.Tensor, q_norm_w: torch.Tensor, k_norm_w: torch.Tensor, eps: float,
                         cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         rows: torch.Tensor, positions: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                         quantize: bool = False, block_s: int = 64, splits: int | None = None):
    """One decode token per sequence, in one launch: qkv [B, (H + 2 Hkv) D] -> the
    attention output [B, H, D], as ``decode_attention(qk_norm_rope_cache(...), ...,
    positions + 1)`` computes it (the same function, same cache writes at (rows[b],
    positions[b]); rows[b] must be b, the row the attention reads; see FUSE_QKV_ATTENTION
    for the bits). With ``quantize`` (head_dim 128) the
    output comes as the Fp8Activation [B, H*D] that quantize_activation_fp8 would make of
    it, for a block-FP8 o_proj. ``splits``: key splits per (sequence, KV head) (default:
    kv_splits' choice with SPLIT_KV_ATTENTION on, else 1)."""
    from quantroll.kernels.decode_attention_triton import decode_attention_qkv_kernel
    from quantroll.kernels.fp8_linear import Fp8Activation
    from quantroll.kernels.fused import FP8_GROUP, fp8_output_buffers

    if not fuses_qkv(head_dim):
        raise ValueError(f"decode_attention_qkv: head_dim {head_dim} is not a power of two in [16, 128]")
    if quantize and head_dim != FP8_GROUP:
        raise ValueError(f"decode_attention_qkv quantizes one {FP8_GROUP}-group per head, head_dim is {head_dim}")
    b = qkv.shape[0]
    group = heads // kv_heads
    cos2, sin2 = cos.reshape(b, -1), sin.reshape(b, -1)
    if quantize:
        codes, scales = fp8_output_buffers(b, heads * head_dim, qkv.device)
        out = codes  # placeholder: the kernel stores no BF16 output
    else:
        out = torch.empty(b, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
        codes, scales = out, out.view(b, heads * head_dim)  # placeholders (strides read, never stored to)
    capacity = k_cache.shape[1]
    if splits is None:
        sms = torch.cuda.get_device_properties(qkv.device).multi_processor_count if qkv.is_cuda else 1
        splits, chunk = kv_splits(b * kv_heads, capacity, sms, block_s) if SPLIT_KV_ATTENTION else (1, capacity)
    else:
        chunk = -(-capacity // (splits * block_s)) * block_s
        splits = -(-capacity // chunk)
    if splits > 1:
        if b * kv_heads > _MAX_PAIRS:
            raise ValueError(f"decode_attention_qkv: {b * kv_heads} sequence/KV-head pairs exceed {_MAX_PAIRS}")
        g_pad = next_pow2(group, 16)
        state = torch.empty(b * kv_heads * splits * g_pad * (head_dim + 2), dtype=torch.float32, device=qkv.device)
        pair_counters = counters(PAIR_COUNTERS, qkv.device, _MAX_PAIRS)
    else:
        state = pair_counters = scales  # unused by the kernel
    decode_attention_qkv_kernel[(b, kv_heads, splits)](
        qkv, q_norm_w, k_norm_w, cos2, sin2, k_cache, v_cache, rows, positions, out, codes, scales, state, pair_counters,
        eps, head_dim**-0.5,
        qkv.stride(0), cos2.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        codes.stride(0), scales.stride(0), scales.stride(1),
        HQ=heads, HKV=kv_heads, D=head_dim, GROUP=group, G_PAD=next_pow2(group, 16), BLOCK_S=block_s, QUANT=quantize,
        SPLITS=splits, CHUNK=chunk if splits > 1 else block_s, num_warps=4, num_stages=2,
    )
    if quantize:
        return Fp8Activation(codes, scales, torch.Size([b, heads * head_dim]), qkv.dtype)
    return out

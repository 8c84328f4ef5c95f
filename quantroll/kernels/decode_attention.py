"""Wrappers for the Triton decode-attention kernels (see decode_attention_triton.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.kernels import fp8_gemv

# Decode from the fused q/k/v projection in one launch (decode_attention_qkv) instead of
# two (qk_norm_rope_cache + decode_attention), and hand a block-FP8 o_proj its input
# already quantized. Measured on the H200 (Qwen3-8B shape, 2026-12-01): 0.11-0.14 ms less
# per decode step at batch 16 and 64, BF16 and FP8 alike (docs/PERFORMANCE.md). Not
# bit-identical to the two launches on the GPU: Triton orders and contracts the q/k norm
# and rotary arithmetic of the two kernels differently (last bits of q and k); both sit
# the same distance from a float64 step (tests/engine/test_decode_attention_fused.py).
FUSE_QKV_ATTENTION = True


@dataclass(frozen=True)
class AttentionTiles:
    """Launch shape of the one-launch decode attention: keys per loop step, warps, and
    software-pipeline stages of the key loop. One program per (sequence, KV head) walks
    all of that sequence's keys."""

    block_s: int = 64
    num_warps: int = 4
    num_stages: int = 2


# Measured on the H200 (bench/attention_tiles.py, 2026-12-01; Qwen3-8B heads, ~256 keys per
# sequence): with at most one program per SM (batch 16: 128 pairs) a third pipeline stage
# takes the kernel from 14.4-14.8 to 12.0-12.1 us (8B FP8 step 3.43-3.47 -> 3.41-3.43 ms);
# with four per SM (batch 64) it costs 25.2 -> 30.0 us, so it stays at two there. More warps,
# other key blocks, and keys split over programs with a merging launch were slower.
ONE_WAVE_TILES = AttentionTiles(num_stages=3)
MANY_WAVE_TILES = AttentionTiles()
TILES: AttentionTiles | None = None  # one shape for every batch (benchmarks); None: tiles_for


def tiles_for(pairs: int, sms: int) -> AttentionTiles:
    """The launch shape for ``pairs`` (sequence, KV head) programs on ``sms`` SMs."""
    if TILES is not None:
        return TILES
    return ONE_WAVE_TILES if pairs <= sms else MANY_WAVE_TILES


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


def fuses_qkv(head_dim: int) -> bool:
    """Head sizes the one-launch kernel reproduces bit for bit: powers of two from 16 (the
    dot's smallest K) to 128 (beyond it, the RMS sums of the q/k norm kernel add more than
    two elements per lane, an order _sum_squares does not spell out)."""
    return 16 <= head_dim <= 128 and head_dim & (head_dim - 1) == 0


def decode_attention_qkv(qkv: torch.Tensor, q_norm_w: torch.Tensor, k_norm_w: torch.Tensor, eps: float,
                         cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         rows: torch.Tensor, positions: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                         quantize: bool = False, tiles: AttentionTiles | None = None):
    """One decode token per sequence, in one launch: qkv [B, (H + 2 Hkv) D] -> the
    attention output [B, H, D], as ``decode_attention(qk_norm_rope_cache(...), ...,
    positions + 1)`` computes it (the same function, same cache writes at (rows[b],
    positions[b]); rows[b] must be b, the row the attention reads; see FUSE_QKV_ATTENTION
    for the bits). With ``quantize`` (head_dim 128) the
    output comes as the Fp8Activation [B, H*D] that quantize_activation_fp8 would make of
    it, for a block-FP8 o_proj. ``tiles``: the launch shape (default ``tiles_for``)."""
    from quantroll.kernels.decode_attention_triton import decode_attention_qkv_kernel
    from quantroll.kernels.fp8_linear import Fp8Activation
    from quantroll.kernels.fused import FP8_GROUP, fp8_output_buffers

    if not fuses_qkv(head_dim):
        raise ValueError(f"decode_attention_qkv: head_dim {head_dim} is not a power of two in [16, 128]")
    if quantize and head_dim != FP8_GROUP:
        raise ValueError(f"decode_attention_qkv quantizes one {FP8_GROUP}-group per head, head_dim is {head_dim}")
    b = qkv.shape[0]
    group = heads // kv_heads
    if tiles is None:
        sms = torch.cuda.get_device_properties(qkv.device).multi_processor_count if qkv.is_cuda else 1
        tiles = tiles_for(b * kv_heads, sms)
    cos2, sin2 = cos.reshape(b, -1), sin.reshape(b, -1)
    if quantize:
        codes, scales = fp8_output_buffers(b, heads * head_dim, qkv.device)
        out = codes  # placeholder: the kernel stores no BF16 output
    else:
        out = torch.empty(b, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
        codes, scales = out, out.view(b, heads * head_dim)  # placeholders (strides read, never stored to)
    decode_attention_qkv_kernel[(b, kv_heads)](
        qkv, q_norm_w, k_norm_w, cos2, sin2, k_cache, v_cache, rows, positions, out, codes, scales,
        eps, head_dim**-0.5,
        qkv.stride(0), cos2.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        codes.stride(0), scales.stride(0), scales.stride(1),
        HQ=heads, HKV=kv_heads, D=head_dim, GROUP=group, G_PAD=next_pow2(group, 16), BLOCK_S=tiles.block_s,
        QUANT=quantize, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        RELEASE=fp8_gemv.release_producers(qkv.device, "attention"),
    )
    if quantize:
        return Fp8Activation(codes, scales, torch.Size([b, heads * head_dim]), qkv.dtype)
    return out

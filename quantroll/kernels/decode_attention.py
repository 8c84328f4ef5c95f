"""Wrapper for the Triton decode-attention kernel (see decode_attention_triton.py)."""

from __future__ import annotations

import torch


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

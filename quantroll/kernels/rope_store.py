"""A decode step from the fused q/k/v projection for families without QK-norm: rotary
and the key/value store in one launch (rope_store_triton.py), then the paged decode
attention. ``paged_attention.decode_from_qkv`` is the QK-norm twin."""

from __future__ import annotations

import torch

from quantroll.kernels import paged_attention


def decode_from_qkv_rope(qkv: torch.Tensor, cos, sin, cache, layer: int, batch) -> torch.Tensor:
    """qkv [B, (H + 2 Hkv) D] (biases already added) -> attention output [B, H, D]."""
    from quantroll.kernels.rope_store_triton import rope_store_kv_kernel

    b = qkv.shape[0]
    h, hkv, d = cache.heads, cache.kv_heads, cache.head_dim
    q = torch.empty(b, h, d, dtype=qkv.dtype, device=qkv.device)
    cos2, sin2 = cos.reshape(b, -1), sin.reshape(b, -1)
    k, v, ks, vs = paged_attention._pools(cache, layer)
    rope_store_kv_kernel[(b, h + hkv)](
        qkv, cos2, sin2, q, k, v, ks, vs, batch.slots,
        qkv.stride(0), cos2.stride(0), q.stride(0), q.stride(1), HQ=h, HKV=hkv, D=d, FP8=cache.quantized,
        BLOCK_SIZE=cache.block_size, num_warps=1)
    return paged_attention.decode_attention(q, cache, layer, batch)

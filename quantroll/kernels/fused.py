"""Wrappers for the fused decode kernels (fused_triton.py)."""

from __future__ import annotations

import torch

from quantroll.kernels.decode_attention import next_pow2


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rmsnorm(x + delta)); with delta None: (x, rmsnorm(x)). Rows of the last dim."""
    from quantroll.kernels.fused_triton import add_rmsnorm_kernel

    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    d2 = delta.reshape(-1, h) if delta is not None else x2
    res = torch.empty_like(x2) if delta is not None else x2
    y = torch.empty_like(x2)
    add_rmsnorm_kernel[(x2.shape[0],)](x2, d2, weight, res, y, h, eps, x2.stride(0), d2.stride(0), res.stride(0),
                                       y.stride(0), HAS_DELTA=delta is not None, BLOCK=next_pow2(h, 1), num_warps=8)
    return res.view(x.shape), y.view(x.shape)


def qk_norm_rope_cache(qkv: torch.Tensor, q_norm_w, k_norm_w, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                       heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """qkv [T, (H + 2 Hkv) D] -> q [T, H, D] normalized and rotated; k (normalized,
    rotated) and v written into the caches at (rows[t], positions[t])."""
    from quantroll.kernels.fused_triton import qk_norm_rope_cache_kernel

    t = qkv.shape[0]
    q = torch.empty(t, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    cos2, sin2 = cos.reshape(t, -1), sin.reshape(t, -1)
    qk_norm_rope_cache_kernel[(t, heads + kv_heads)](
        qkv, q_norm_w, k_norm_w, cos2, sin2, q, k_cache, v_cache, rows, positions, eps,
        qkv.stride(0), cos2.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HQ=heads, HKV=kv_heads, D=head_dim, num_warps=1)
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] -> bf16(silu(gate)) * up [..., I]."""
    from quantroll.kernels.fused_triton import silu_mul_kernel

    two_i = gate_up.shape[-1]
    g2 = gate_up.reshape(-1, two_i)
    inter = two_i // 2
    y = torch.empty(g2.shape[0], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    silu_mul_kernel[(g2.shape[0], (inter + block - 1) // block)](g2, y, inter, g2.stride(0), y.stride(0), BLOCK=block)
    return y.view(*gate_up.shape[:-1], inter)

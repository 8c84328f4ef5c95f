"""Launchers of the row-wise batch-invariant kernels (invariant_rows_triton.py): one
program a row, launch shapes that depend on the row's length alone."""

from __future__ import annotations

import torch

from quantroll.kernels.launch import next_pow2

LOG_SOFTMAX_BLOCK = 4096  # lanes of the vocabulary loop (151,936 entries: 38 steps a pass)


def _warps(block: int) -> int:
    return max(1, min(8, block // 256))


def _unit_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """x as [rows, width] with unit stride along each row (a view where it can be)."""
    rows = x.reshape(-1, width)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis (its length: ``weight``'s) in x's dtype."""
    from quantroll.kernels.invariant_rows_triton import rms_norm_rows_kernel

    h = weight.shape[0]
    x2 = _unit_rows(x, h)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = next_pow2(h, 16)
        rms_norm_rows_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, h, x2.stride(0), y.stride(0), float(h), float(eps),
                                              BLOCK=block, num_warps=_warps(block))
    return y.view(x.shape)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"the invariant log-softmax takes float32 logits, got {x.dtype}")
    return _unit_rows(x, x.shape[-1])


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last axis of float32 ``x``, float32."""
    from quantroll.kernels.invariant_rows_triton import log_softmax_rows_kernel

    x2 = _rows(x)
    y = torch.empty(x2.shape, dtype=torch.float32, device=x.device)
    if x2.shape[0] and x2.shape[1]:
        log_softmax_rows_kernel[(x2.shape[0],)](x2, y, y, y, y, y, x2.shape[1], x2.stride(0), y.stride(0),
                                                BLOCK=LOG_SOFTMAX_BLOCK, STORE=True, SAMPLE=False, GREEDY=False,
                                                num_warps=_warps(LOG_SOFTMAX_BLOCK))
    return y.view(x.shape)


def sample(x: torch.Tensor, greedy: bool, seeds: torch.Tensor, positions: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Untruncated sampling from float32 scaled logits x [B, V] (logits / T): (tokens int64
    [B], their logprobs float32 [B]), each logprob the bits ``log_softmax(x)`` has there.
    greedy: argmax; otherwise Gumbel-max with the noise of (seeds[b], positions[b], id)."""
    from quantroll.kernels.invariant_rows_triton import log_softmax_rows_kernel

    x2 = _rows(x)
    b = x2.shape[0]
    tokens = torch.empty(b, dtype=torch.int64, device=x.device)
    logprobs = torch.empty(b, dtype=torch.float32, device=x.device)
    if b:
        log_softmax_rows_kernel[(b,)](x2, x2, seeds, positions, tokens, logprobs, x2.shape[1], x2.stride(0), 0,
                                      BLOCK=LOG_SOFTMAX_BLOCK, STORE=False, SAMPLE=True, GREEDY=greedy,
                                      num_warps=_warps(LOG_SOFTMAX_BLOCK))
    return tokens, logprobs


def norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
              ) -> torch.Tensor:
    """RMSNorm of each head then rotary: x [B, T, H, D] (any strides with unit last), weight
    [D], cos / sin [B, T, D] -> [B, T, H, D] contiguous, in x's dtype."""
    from quantroll.kernels.invariant_rows_triton import norm_rope_rows_kernel

    b, t, h, d = x.shape
    if d % 2 or d & (d - 1):
        raise ValueError(f"norm_rope takes a power-of-two head_dim, got {d}")
    if x.stride(-1) != 1 or x.stride(0) != t * x.stride(1):
        x = x.contiguous()
    cos2 = cos.reshape(b * t, d).contiguous()
    sin2 = sin.reshape(b * t, d).contiguous()
    y = torch.empty(b, t, h, d, dtype=x.dtype, device=x.device)
    if x.numel():
        norm_rope_rows_kernel[(b * t * h,)](x, weight.contiguous(), cos2, sin2, y, h, x.stride(1), x.stride(2),
                                            cos2.stride(0), y.stride(1), y.stride(2), float(d), float(eps),
                                            HALF=d // 2, num_warps=1)
    return y


SILU_BLOCK = 1024


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up over [..., I] tensors (rows of any stride, unit last), gate's dtype."""
    from quantroll.kernels.invariant_rows_triton import silu_mul_rows_kernel

    i = gate.shape[-1]
    g2, u2 = _unit_rows(gate, i), _unit_rows(up, i)
    y = torch.empty(g2.shape, dtype=gate.dtype, device=gate.device)
    if g2.shape[0] and i:
        silu_mul_rows_kernel[(g2.shape[0], -(-i // SILU_BLOCK))](g2, u2, y, i, g2.stride(0), u2.stride(0),
                                                                 y.stride(0), BLOCK=SILU_BLOCK, num_warps=4)
    return y.view(*gate.shape[:-1], i)

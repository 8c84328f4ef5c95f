"""Launchers of the row-wise batch-invariant kernels (invariant_rows_triton.py): one
program a row, launch shapes that depend on the row's length alone."""

from __future__ import annotations

import torch

from quantroll.kernels.launch import next_pow2

LOG_SOFTMAX_BLOCK = 4096  # lanes of the vocabulary loop (151,936 entries: 38 steps a pass)


def _warps(block: int) -> int:
    return max(1, min(8, block // 256))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis (its length: ``weight``'s) in x's dtype."""
    from quantroll.kernels.invariant_rows_triton import rms_norm_rows_kernel

    h = weight.shape[0]
    x2 = x.reshape(-1, h)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = next_pow2(h, 16)
        rms_norm_rows_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, h, x2.stride(0), y.stride(0), float(h), float(eps),
                                              BLOCK=block, num_warps=_warps(block))
    return y.view(x.shape)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"the invariant log-softmax takes float32 logits, got {x.dtype}")
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


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

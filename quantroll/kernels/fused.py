"""Wrappers for the fused decode kernels (fused_triton.py).

``add_rmsnorm`` and ``silu_mul`` can hand their output to a block-FP8 linear already
quantized (``quantize=True`` -> an ``Fp8Activation``), which saves the linear its own
activation-quantization launch; the codes and scales are bit-identical to what that
launch would make of the BF16 output.
"""

from __future__ import annotations

import torch

from quantroll.kernels import fp8_gemv
from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS, EngineKernels
from quantroll.kernels.launch import next_pow2
from quantroll.kernels.fp8_activation import FP8_GROUP  # noqa: F401 (its users' name: fused.FP8_GROUP)
from quantroll.kernels.fp8_linear import Fp8Activation, fp8_activation_buffers


def fp8_output_buffers(m: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``fp8_activation_buffers`` for a fused kernel's output, whose programs quantize whole
    1x128 groups only (so the row length must be a multiple of 128)."""
    if k % FP8_GROUP:
        raise ValueError(f"fused FP8 quantization needs a row length that is a multiple of {FP8_GROUP}, got {k}")
    return fp8_activation_buffers(m, k, device)


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, quantize: bool = False,
                keep_bf16: bool = False, kernels: EngineKernels = DEFAULT_ENGINE_KERNELS
                ) -> tuple[torch.Tensor, torch.Tensor | Fp8Activation]:
    """(x + delta, rmsnorm(x + delta)); with delta None: (x, rmsnorm(x)). Rows of the last dim.
    With ``quantize`` the norm comes back as an Fp8Activation (last dim a multiple of 128),
    with ``keep_bf16`` too that activation also carries the BF16 norm as ``source`` (one
    launch writes both: a MoE block's router reads BF16, its FP8 experts the codes).
    ``kernels``: warps per row, and whether to release the decode GEMM after it."""
    from quantroll.kernels.fused_triton import add_rmsnorm_kernel

    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    d2 = delta.reshape(-1, h) if delta is not None else x2
    res = torch.empty_like(x2) if delta is not None else x2
    store_y = keep_bf16 or not quantize
    y = torch.empty_like(x2) if store_y else x2  # without it: a placeholder the kernel never touches
    q, s = fp8_output_buffers(x2.shape[0], h, x.device) if quantize else (y, y)  # placeholders without
    add_rmsnorm_kernel[(x2.shape[0],)](x2, d2, weight, res, y, q, s, h, eps, x2.stride(0), d2.stride(0), res.stride(0),
                                       y.stride(0), q.stride(0), s.stride(0), s.stride(1), HAS_DELTA=delta is not None,
                                       QUANT=quantize, BLOCK=next_pow2(h, 1), STORE_Y=store_y,
                                       num_warps=kernels.norm_warps,
                                       RELEASE=fp8_gemv.release_producers(x.device, "norm", kernels))
    if quantize:
        return res.view(x.shape), Fp8Activation(q, s, x.shape, x.dtype, y.view(x.shape) if keep_bf16 else None)
    return res.view(x.shape), y.view(x.shape)


def silu_mul(gate_up: torch.Tensor, quantize: bool = False, kernels: EngineKernels = DEFAULT_ENGINE_KERNELS
             ) -> torch.Tensor | Fp8Activation:
    """gate_up [..., 2I] -> bf16(silu(gate)) * up [..., I]; with ``quantize`` as an
    Fp8Activation (I a multiple of 128)."""
    from quantroll.kernels.fused_triton import silu_mul_kernel

    two_i = gate_up.shape[-1]
    g2 = gate_up.reshape(-1, two_i)
    inter = two_i // 2
    shape = torch.Size([*gate_up.shape[:-1], inter])
    y = g2 if quantize else torch.empty(g2.shape[0], inter, dtype=gate_up.dtype, device=gate_up.device)  # see add_rmsnorm
    q, s = fp8_output_buffers(g2.shape[0], inter, gate_up.device) if quantize else (y, y)
    block = 1024  # a multiple of 128: each program quantizes whole groups
    silu_mul_kernel[(g2.shape[0], (inter + block - 1) // block)](
        g2, y, q, s, inter, g2.stride(0), y.stride(0), q.stride(0), s.stride(0), s.stride(1), QUANT=quantize, BLOCK=block,
        RELEASE=fp8_gemv.release_producers(gate_up.device, "silu", kernels))
    if quantize:
        return Fp8Activation(q, s, shape, gate_up.dtype)
    return y.view(shape)

"""Unified low precision in the trainer (modes 2-4): the forward pass computes with the
engine's quantization, the backward pass with the original BF16 operands.

Forward: y = deq(q_act(x)) @ deq(q_w(W))^T, the same block quantization of weights and
activations the engine applies (exactly emulated; real FP8 GEMMs on Hopper for block FP8).
Backward (straight-through): dX = dY W and dW = dY^T X on the unquantized operands, so
the optimizer sees BF16 gradients and the FP32 master weights stay the truth.
"""

from __future__ import annotations

import torch

from quantroll.formats import Format
from quantroll.model import invariant
from quantroll.model.kernel_config import DEFAULT_KERNELS, KernelConfig


def _forward_emulated(x: torch.Tensor, w: torch.Tensor, fmt: Format, kernels: KernelConfig) -> torch.Tensor:
    """The engine's emulated forward (linear.emulated_forward) on the trainer's operands;
    with batch-invariant kernels the same tiled GEMM, so mode 2 matches it bit for bit."""
    xq = fmt.dequantize(fmt.quantize_activation(x.detach(), name="trainer activation"))
    wq = fmt.dequantize(fmt.quantize_weight(w.detach(), name="trainer weight"))
    if kernels.batch_invariant:
        return invariant.matmul(xq, wq, kernels).to(x.dtype)
    return (xq @ wq.t()).to(x.dtype)


def _forward_fp8_gpu(x: torch.Tensor, w: torch.Tensor, fmt: Format) -> torch.Tensor:
    from quantroll.kernels import quantize_weight_gpu
    from quantroll.kernels.fp8_linear import fp8_gemm, quantize_activation_fp8

    x2d = x.detach().reshape(-1, x.shape[-1]).contiguous()
    wq = quantize_weight_gpu(w.detach(), fmt, name="trainer weight", check_finite=False)
    aq, a_s = quantize_activation_fp8(x2d)
    return fp8_gemm(aq, a_s, wq.data, wq.scale, x.dtype).reshape(*x.shape[:-1], w.shape[0])


class QuantizedForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, fmt: Format, real_fp8: bool, kernels: KernelConfig
                ) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _forward_fp8_gpu(x, w, fmt) if real_fp8 else _forward_emulated(x, w, fmt, kernels)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dx = dy @ w.to(dy.dtype) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1]).to(dy.dtype)).to(w.dtype)
        return dx, dw, None, None, None


def quantized_forward_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, fmt: Format,
                             real_fp8: bool = False, kernels: KernelConfig = DEFAULT_KERNELS) -> torch.Tensor:
    y = QuantizedForward.apply(x, w, fmt, real_fp8, kernels)
    return y if bias is None else y + bias

"""The operands of one FP8 GEMM benchmark case, shared by the GEMM benches: a BF16
activation, several distinct weights (so that graph replays never find one in L2), their
block-FP8 forms, the quantized activation, and the relative error of an output against
float64 on the same FP8 operands."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.formats import get_format

FP8 = get_format("fp8")


@dataclass
class GemmCase:
    x: torch.Tensor  # [M, K] bf16
    weights: list[torch.Tensor]  # COPIES x [N, K] bf16
    quantized: list  # their block-FP8 forms (.data codes, .scale)
    aq: torch.Tensor  # activation codes [M, K]
    a_s: torch.Tensor  # activation scales, outer-dim-major
    ref: torch.Tensor  # float64 product of the dequantized operands (first weight)

    def err(self, y: torch.Tensor) -> float:
        """Relative Frobenius error of ``y`` against float64 on the same FP8 operands."""
        return ((y.double() - self.ref).norm() / self.ref.norm()).item()


def gemm_case(m: int, n: int, k: int, copies: int, device: str = "cuda") -> GemmCase:
    from quantroll.kernels.fp8_linear import quantize_activation_fp8

    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    weights = [(torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16) for _ in range(copies)]
    quantized = [FP8.quantize_weight(w) for w in weights]
    aq, a_s = quantize_activation_fp8(x)
    ref = FP8.dequantize(FP8.quantize_activation(x.float())).double() @ FP8.dequantize(quantized[0]).double().t()
    return GemmCase(x, weights, quantized, aq, a_s, ref)

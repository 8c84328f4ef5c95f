"""The BF16 decode GEMM (kernels/bf16_decode.py, an experiment against cuBLAS) against a
float64 matmul of the same operands: float32 accumulation, so a float32 output sits
within float32 summation error (~1e-7), whatever the tiles and K splits, and the split
sum is the same every run.

CPU: under Triton's interpreter (a subprocess: this file run as a script) on float16
operands (Triton 3.8's interpreter returns garbage for BF16 dots; float16 takes the same
kernel path). GPU: BF16 on Qwen3-8B's layer shapes, and BF16 output as cuBLAS rounds."""

from __future__ import annotations

import pytest
import torch

from tests.interpreted import needs_triton, run_interpreted

GPU = torch.cuda.is_available()


def float32_sum_bound(k: int) -> float:
    """Relative error allowed for float32 sums of k exact products (BF16 x BF16 fits float32
    exactly): rounding errors of 2^-24 per add, random-walk growth sqrt(k), factor 4 of
    headroom. The H200 run of 2026-12-01 measured 1.0e-6 at K = 4096 and 1.4e-5 at K = 12288
    (split 1), so a flat 1e-6 was too tight."""
    return 4 * k**0.5 * 2**-24


def excess_over_bf16_rounding(y: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> float:
    """max(|y - a w^T| - (half a BF16 ulp of a w^T + float32_sum_bound(K) |a| |w|^T)) for
    float64 operands a [M, K], w [N, K]: <= 0 when the BF16 output y is the float64 product
    rounded, up to float32 summation error (the CUDA decode GEMMs' check)."""
    ref, mag = a @ w.t(), a.abs() @ w.abs().t()
    half_ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref.abs())[1] - 9)  # 2^(e-1) * 2^-8
    return ((y.double() - ref).abs() - half_ulp - float32_sum_bound(a.shape[1]) * mag).max().item()


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double().cpu() - ref).norm() / ref.norm()).item()


def check(device: str, dtype: torch.dtype, shapes) -> None:
    from quantroll.kernels.bf16_decode import bf16_gemm_decode
    from quantroll.kernels.fp8_linear import DecodeGemmConfig, _tile_counters

    gen = torch.Generator().manual_seed(0)
    for m, n, k in shapes:
        x = torch.randn(m, k, generator=gen).to(dtype).to(device)
        w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype).to(device)
        ref = x.double().cpu() @ w.double().cpu().t()
        for cfg in (None, DecodeGemmConfig(split_k=1), DecodeGemmConfig(block_n=16, split_k=4),
                    DecodeGemmConfig(block_n=64, split_k=2, num_warps=4)):
            y = bf16_gemm_decode(x, w, torch.float32, cfg)
            assert _rel(y, ref) < float32_sum_bound(k), (m, n, k, cfg, _rel(y, ref))
            assert torch.equal(bf16_gemm_decode(x, w, torch.float32, cfg), y), "not the same every run"
            low = bf16_gemm_decode(x, w, None, cfg)
            assert low.dtype == dtype and torch.allclose(low.float(), y, rtol=2**-7, atol=0)
            assert int(_tile_counters(x.device).abs().sum()) == 0, "split-K counters not reset"
    with pytest.raises(ValueError, match="M <= 64"):
        bf16_gemm_decode(torch.zeros(65, 128, dtype=dtype, device=device), torch.zeros(8, 128, dtype=dtype, device=device))


@needs_triton
def test_bf16_decode_gemm_under_interpreter():
    run_interpreted([__file__], "bf16 decode gemm ok", timeout=600)


if GPU:
    @pytest.mark.gpu
    def test_bf16_decode_gemm_on_gpu():
        check("cuda", torch.bfloat16, [(1, 6144, 4096), (16, 4096, 4096), (64, 4096, 12288), (5, 200, 300)])
        x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(24576, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
        from quantroll.kernels.bf16_decode import bf16_gemm_decode

        ours, cublas = bf16_gemm_decode(x, w), x @ w.t()
        rel = ((ours.float() - cublas.float()).norm() / cublas.float().norm()).item()
        assert rel < 4e-3, rel  # both round float32 sums to BF16; the sums' orders differ


def main() -> int:
    import os

    assert os.environ.get("TRITON_INTERPRET") == "1"
    check("cpu", torch.float16, [(1, 256, 512), (5, 200, 300), (20, 384, 640), (40, 160, 256)])
    print("bf16 decode gemm ok")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

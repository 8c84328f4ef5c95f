"""The FP8 GEMM kernels' logic on a CPU: decode (transposed tiles, in-kernel split-K with
arrival counters) and prefill, run by Triton's interpreter on CPU tensors in a subprocess
(this file run as a script), against float64 on the same FP8 operands.

The operands come from the reference quantizer (formats), not from act_quant_fp8_kernel:
the interpreter's own float32 -> e4m3 cast is inexact (tests/kernels/interpret_check.py),
while its dots on given codes are float32-accurate. What this covers: tiling and masks on
shapes that are not multiples of the tiles, M over several row tiles, split-K sums equal
whatever the split, the counters back at zero after every call (a CUDA-graph replay
relies on it), BF16 output within one BF16 step of the float32 result. The GPU tests
(test_gpu_engine.py) check the same kernels on the hardware's MMA paths."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from tests.interpreted import needs_triton, run_interpreted

ROOT = Path(__file__).resolve().parents[2]


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def check_gemms() -> None:
    from quantroll.formats import get_format
    from quantroll.kernels import fp8_linear
    from quantroll.kernels.counters import existing
    from quantroll.kernels.fp8_linear import DecodeGemmConfig, fp8_gemm, fp8_gemm_decode, fp8_gemm_prefill
    from quantroll.kernels.gemm_plan import NATIVE_DECODE

    fmt = get_format("fp8")
    gen = torch.Generator().manual_seed(0)
    # (M, N, K): one row, ragged N and K, M over two 32-row tiles, a prefill-sized M
    for m, n, k in [(1, 256, 512), (5, 200, 300), (20, 384, 640), (40, 160, 256), (70, 200, 384)]:
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        xq = fmt.quantize_activation(x.float())
        wq = fmt.quantize_weight(torch.randn(n, k, generator=gen) * 0.02)
        a_s = xq.scale.t().contiguous().t()  # the outer-dim-major layout the kernels read
        ref = fmt.dequantize(xq).double() @ fmt.dequantize(wq).double().t()
        if m > 64:
            y = fp8_gemm_prefill(xq.data, a_s, wq.data, wq.scale, torch.float32)
            assert _rel(y, ref) < 1e-6, (m, n, k, _rel(y, ref))
            assert torch.equal(fp8_gemm(xq.data, a_s, wq.data, wq.scale, torch.float32), y)  # the dispatcher's pick
            continue
        one = fp8_gemm_decode(xq.data, a_s, wq.data, wq.scale, torch.float32, DecodeGemmConfig(split_k=1))
        assert _rel(one, ref) < 1e-6, (m, n, k, _rel(one, ref))
        for cfg in (DecodeGemmConfig(split_k=2), DecodeGemmConfig(block_n=16, split_k=4), None, NATIVE_DECODE,
                    DecodeGemmConfig(block_n=64, split_k=2, dot_f16=True, num_warps=4),
                    DecodeGemmConfig(block_n=64, block_m=128, split_k=4, imprecise_acc=128, num_warps=4)):
            y = fp8_gemm_decode(xq.data, a_s, wq.data, wq.scale, torch.float32, cfg)
            assert _rel(y, one.double()) < 1e-6, (m, n, k, cfg)
            # BF16 output within one BF16 step of the float32 result (the interpreter's own cast
            # need not round to nearest even; test_gpu_engine.py checks RNE on the device)
            low = fp8_gemm_decode(xq.data, a_s, wq.data, wq.scale, torch.bfloat16, cfg)
            assert torch.allclose(low.float(), y, rtol=2**-7, atol=0), (m, n, k, cfg)
            counters = existing(fp8_linear.TILE_COUNTERS, x.device)
            assert counters is None or int(counters.abs().sum()) == 0, "split-K counters not reset"
    empty = fp8_gemm(torch.empty(0, 256, dtype=torch.float8_e4m3fn), torch.empty(2, 0).t(), wq.data[:, :256],
                     wq.scale[:, :2], torch.bfloat16)
    assert empty.shape == (0, wq.shape[0])


@needs_triton
def test_fp8_gemm_kernels_under_interpreter():
    run_interpreted([__file__], "fp8 gemm kernels ok", timeout=300)


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    check_gemms()
    print("fp8 gemm kernels ok")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

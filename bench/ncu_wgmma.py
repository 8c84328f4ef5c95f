"""One launch each of the wgmma decode GEMM and of the shipped decode GEMMs on gate_up
(24576 x 4096) for Nsight Compute: the default 64-row ws variant and the Triton decode GEMM
at M = 64, the pipelined 16-row variant and the CUDA mma.sync kernel at M = 16.
Run under: ncu -k regex:"fp8_wgmma|fp8_gemv|fp8_gemm_decode" --set full python bench/ncu_wgmma.py"""
import torch

from quantroll.formats import get_format
from quantroll.kernels import fp8_gemv, fp8_linear, fp8_wgmma
from quantroll.kernels.fp8_linear import quantize_activation_fp8

FP8 = get_format("fp8")
n, k = 24576, 4096
w = FP8.quantize_weight((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16))
a64 = quantize_activation_fp8(torch.randn(64, k, device="cuda", dtype=torch.bfloat16))
a16 = quantize_activation_fp8(torch.randn(16, k, device="cuda", dtype=torch.bfloat16))
pipe16 = fp8_wgmma.WgmmaConfig(16, 1, 2, 3, 2, 1, 4, False, True)
runs = [("ws64", lambda: fp8_wgmma.fp8_wgmma(*a64, w.data, w.scale, fp8_wgmma.DEFAULT, early=False)),
        ("triton64", lambda: fp8_linear.fp8_gemm_decode(*a64, w.data, w.scale)),
        ("pipe16", lambda: fp8_wgmma.fp8_wgmma(*a16, w.data, w.scale, pipe16, early=False)),
        ("gemv16", lambda: fp8_gemv.fp8_gemv(*a16, w.data, w.scale, early=False))]
for name, run in runs:
    run()
    torch.cuda.synchronize()
    print(name, flush=True)

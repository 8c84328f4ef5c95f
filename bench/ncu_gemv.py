"""One launch each of the CUDA decode GEMM on gate_up (24576 x 4096) for Nsight Compute:
the 16-row variant at M = 1 and M = 16 (same kernel, only the token rows differ), and the
M = 1 choice. Run under: ncu -k regex:fp8_gemv --set full python bench/ncu_gemv.py"""
import torch

from quantroll.formats import get_format
from quantroll.kernels import fp8_gemv
from quantroll.kernels.fp8_linear import quantize_activation_fp8

FP8 = get_format("fp8")


def main():
    n, k = 24576, 4096
    w = FP8.quantize_weight((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16))
    for m, cfg in ((1, fp8_gemv.GemvConfig(2, 1, 4, 1, 1)), (16, fp8_gemv.GemvConfig(2, 1, 4, 1, 1)),
                   (1, fp8_gemv.GemvConfig(1, 2, 4, 2, 0))):
        aq, a_s = quantize_activation_fp8(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        fp8_gemv.fp8_gemv(aq, a_s, w.data, w.scale, cfg, early=False)
        torch.cuda.synchronize()
        print(f"M={m} {cfg.kernel}", flush=True)


if __name__ == "__main__":
    main()

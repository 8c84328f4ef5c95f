"""What the FP8 quantization costs in the decode step's add + RMSNorm launch (fused_triton.
add_rmsnorm_kernel), on the Qwen3-8B hidden size: graph-timed per call (median of 20, over
8 distinct inputs), QUANT off (BF16 out) and on (codes + scales out), per warps per program.
Correctness first: the QUANT codes and scales equal quantize_activation_fp8 of the BF16 out.

    python bench/norm_quant.py
"""
import itertools

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels.fp8_linear import fp8_activation_buffers, quantize_activation_fp8
from quantroll.kernels.fused import add_rmsnorm
from quantroll.kernels.fused_triton import add_rmsnorm_kernel

H, COPIES = 4096, 8


def launch(x, d, w, res, y, q, s, quant: bool, warps: int):
    add_rmsnorm_kernel[(x.shape[0],)](x, d, w, res, y, q, s, H, 1e-6, x.stride(0), d.stride(0), res.stride(0),
                                      y.stride(0), q.stride(0), s.stride(0), s.stride(1), HAS_DELTA=True,
                                      QUANT=quant, BLOCK=H, STORE_Y=not quant, num_warps=warps)


def main():
    torch.manual_seed(0)
    w = torch.randn(H, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, H, device="cuda", dtype=torch.bfloat16)
    d = torch.randn(64, H, device="cuda", dtype=torch.bfloat16)
    _, norm = add_rmsnorm(x, d, w, 1e-6)
    _, act = add_rmsnorm(x, d, w, 1e-6, quantize=True)
    ref_q, ref_s = quantize_activation_fp8(norm)
    same = torch.equal(act.codes.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(act.scales, ref_s)
    print(f"QUANT codes/scales equal the separate quantization: {same}", flush=True)
    rows = []
    for m, warps in itertools.product((1, 16, 64), (4, 8, 16)):
        xs = [torch.randn(m, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        ds = [torch.randn(m, H, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        res, y = torch.empty_like(xs[0]), torch.empty_like(xs[0])
        q, s = fp8_activation_buffers(m, H, torch.device("cuda"))
        t = {quant: graph_time_us(lambda j: launch(xs[j], ds[j], w, res, y, q, s, quant, warps), COPIES)
             for quant in (False, True)}
        rows.append((m, warps, t[False], t[True]))
    print("\n  M  warps  bf16 out us  fp8 out us")
    for m, warps, a, b in rows:
        print(f"{m:3d}  {warps:5d}  {a:11.2f}  {b:10.2f}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

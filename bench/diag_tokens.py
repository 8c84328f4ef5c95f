"""Diagnostic (not a kernel to ship): how much of the 16-row CUDA decode GEMM's time is
its token work? cuda/diag_gemv.cu compiles fp8_gemv.cu's kernel three ways per variant:
mode 0 as shipped, mode 1 without token loads or conversions (constant B fragments, wrong
results, fewer registers), mode 2 with token loads but no conversions (raw words as
float16 pairs). Mode 0 is first checked against fp8_gemv (same bits); then every mode is
timed per 8B shape (graph time, 8 weight copies, median of 20).

    python bench/diag_tokens.py
"""
import itertools

import torch

from bench.gemv_cuda import COPIES, SHAPES, operands
from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels import cuda_jit, fp8_gemv

CONFIGS = [(2, 1, 4, 1, 1), (2, 1, 8, 1, 1), (2, 2, 4, 1, 1), (2, 2, 8, 1, 1), (1, 2, 8, 1, 1), (1, 2, 4, 2, 0)]


def launch(module, name, cfg, aq, a_s, w, y):
    module.launch(name, (w.data.shape[0] // (16 * cfg.row_tiles), 1, 1), (32 * cfg.warps, 1, 1),
                  aq, aq.stride(0), a_s, a_s.stride(0), a_s.stride(1), w.data, w.data.stride(0), w.scale,
                  w.scale.stride(0), w.scale.stride(1), y, y.stride(0), aq.shape[0], aq.shape[1])


def main():
    module = cuda_jit.load("diag_gemv.cu", torch.device("cuda"))
    totals = {}
    for m, (shape, (n, k)) in itertools.product((1, 16), SHAPES.items()):
        _, aq, a_s, ws = operands(m, n, k, COPIES)
        y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        row = [f"{shape:8s} M={m:2d} bytes {n * k / 4.25e12 * 1e6:5.1f} |"]
        for values in CONFIGS:
            cfg = fp8_gemv.GemvConfig(*values)
            if m > 8 * cfg.token_tiles:
                continue
            base = "diag" + cfg.kernel[8:]
            launch(module, base + "_m0", cfg, aq, a_s, ws[0], y)
            if not torch.equal(y, fp8_gemv.fp8_gemv(aq, a_s, ws[0].data, ws[0].scale, cfg, early=False)):
                raise SystemExit(f"{base}_m0 differs from {cfg.kernel}")
            times = []
            for mode in (0, 1, 2):
                t = graph_time_us(lambda j: launch(module, f"{base}_m{mode}", cfg, aq, a_s, ws[j], y), COPIES)
                times.append(t)
                totals[(m, cfg.kernel[9:], mode)] = totals.get((m, cfg.kernel[9:], mode), 0.0) + t
            row.append(f"{cfg.kernel[9:]} {times[0]:.1f}/{times[1]:.1f}/{times[2]:.1f}")
        print(" ".join(row), flush=True)
    print("\nper 8B layer set, us: shipped kernel / no token work / tokens loaded, not converted")
    for m, name in sorted({(m, name) for m, name, _ in totals}):
        print(f"M={m:2d} {name:14s} " + " / ".join(f"{totals[(m, name, mode)]:6.1f}" for mode in (0, 1, 2)))


if __name__ == "__main__":
    main()

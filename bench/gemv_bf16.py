"""The BF16 decode GEMM on quantroll's CUDA kernel (bf16_gemv_* in kernels/cuda/fp8_gemv.cu)
against cuBLAS, on Qwen3-8B's layer shapes; correctness first (as bench/gemv_cuda.py).

1. Check: every BF16 variant at M = 1..16 on small odd shapes and the 8B shapes against
   float64: each BF16 output within half a BF16 ulp plus float32-summation slack
   (4 sqrt(K) 2^-24 times sum |x||w|), equal across two calls and under graph replay.
2. Time (CUDA graph over 8 distinct weights, median of 20) each variant and cuBLAS at
   M = 1 and 16; the best variant per token tiles and width class.
3. With --ab: the 8B BF16 decode step with cuBLAS and with the CUDA kernel for <= 16 rows
   (tokens and logprobs compared first), at --batches.

    python bench/gemv_bf16.py [--ab] [--batches 1,16] [--layers N]
"""
import argparse
import itertools

import torch

from bench.gemv_cuda import SHAPES, repeat_and_graph_problem
from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels import fp8_gemv
from tests.engine.test_bf16_decode import excess_over_bf16_rounding

CHECK_SHAPES = [(16, 64), (48, 192), (96, 256), (272, 1152), (4096, 4096), (4096, 12288)]
COPIES = 8


def correctness() -> int:
    bad = 0
    for (n, k), m in itertools.product(CHECK_SHAPES, (1, 2, 5, 8, 9, 16)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        for cfg in fp8_gemv.BF16_VARIANTS:
            if 8 * cfg.token_tiles < m or n % cfg.rows:
                continue
            y = fp8_gemv.bf16_gemv(x, w, cfg)
            excess = excess_over_bf16_rounding(y, x.double(), w.double())
            problem = (f"max excess {excess:.2e}" if excess > 0
                       else repeat_and_graph_problem(lambda **kw: fp8_gemv.bf16_gemv(x, w, cfg, **kw), y))
            if problem:
                bad += 1
                print(f"BAD {cfg.bf16_kernel} M={m} N={n} K={k}: {problem}", flush=True)
    print(f"correctness: {bad} failures", flush=True)
    return bad


def timings():
    rows, choice = [], {}
    for (name, (n, k)), m in itertools.product(SHAPES.items(), (1, 16)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ws = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(COPIES)]
        row = {"layer": name, "m": m, "bytes_us": 2 * n * k / 4.25e12 * 1e6,
               "cublas": graph_time_us(lambda j: x @ ws[j].t(), COPIES), "cuda": {}}
        for cfg in fp8_gemv.BF16_VARIANTS:
            if 8 * cfg.token_tiles >= m and n % cfg.rows == 0:
                row["cuda"][cfg] = graph_time_us(lambda j: fp8_gemv.bf16_gemv(x, ws[j], cfg), COPIES)
        best = min(row["cuda"], key=row["cuda"].get)
        rows.append(row)
        print(f"{name:8s} M={m:3d} cuBLAS {row['cublas']:6.1f} | CUDA best {row['cuda'][best]:6.1f} {best.bf16_kernel} "
              f"| bytes {row['bytes_us']:5.1f}", flush=True)
    for m in (1, 16):
        sel = [r for r in rows if r["m"] == m]
        print(f"M={m:3d} layer set: cuBLAS {sum(r['cublas'] for r in sel):6.1f}  CUDA best "
              f"{sum(min(r['cuda'].values()) for r in sel):6.1f}  bytes {sum(r['bytes_us'] for r in sel):5.1f}")
        for width in ("narrow", "wide"):
            sums = {}
            for r in sel:
                if fp8_gemv.width_class(SHAPES[r["layer"]][0]) == width:
                    for cfg, t in r["cuda"].items():
                        sums[cfg] = sums.get(cfg, 0.0) + t
            best = min(sums, key=sums.get)
            choice[(fp8_gemv.token_tiles(m), width)] = (best.token_tiles, best.row_tiles, best.warps, best.unroll,
                                                        best.pipeline)
    print(f"chosen: {choice}", flush=True)
    return choice


def engine_ab(batches, layers):
    """The 8B BF16 step on cuBLAS and on the CUDA kernel for <= 16 rows (bench/switch_ab.py)."""
    from bench.switch_ab import run_variants

    gemv = "quantroll.kernels.fp8_gemv"
    run_variants([("cublas", [(gemv, "BF16_MAX_M", 0)]), ("cuda", [(gemv, "BF16_MAX_M", 16)])], ["cuda"],
                 "qwen3-8b", layers, batches, precision="bf16")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ab", action="store_true")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--layers", type=int, default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    if not fp8_gemv.usable(torch.device("cuda")):
        raise SystemExit("the CUDA kernels cannot be built here (see the warning above)")
    bad = correctness()
    fp8_gemv.BF16_CHOICE.update(timings())
    if args.ab and not bad:
        engine_ab(args.batches, args.layers)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

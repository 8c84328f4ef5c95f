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
import math

import torch

from bench.gemv_cuda import SHAPES
from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels import fp8_gemv

CHECK_SHAPES = [(16, 64), (48, 192), (96, 256), (272, 1152), (4096, 4096), (4096, 12288)]
COPIES = 8


def excess(x, w, y) -> float:
    ref = x.double() @ w.double().t()
    mag = x.double().abs() @ w.double().abs().t()
    half_ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref.abs())[1] - 9)
    return ((y.double() - ref).abs() - half_ulp - 4 * math.sqrt(x.shape[1]) * 2.0 ** -24 * mag).max().item()


def correctness() -> int:
    bad = 0
    for (n, k), m in itertools.product(CHECK_SHAPES, (1, 2, 5, 8, 9, 16)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        for cfg in fp8_gemv.BF16_VARIANTS:
            if 8 * cfg.token_tiles < m or n % cfg.rows:
                continue
            y = fp8_gemv.bf16_gemv(x, w, cfg)
            problem = None if excess(x, w, y) <= 0 else f"max excess {excess(x, w, y):.2e}"
            if problem is None and not torch.equal(y, fp8_gemv.bf16_gemv(x, w, cfg, early=False)):
                problem = "differs between two calls"
            if problem is None:
                out = torch.empty_like(y)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fp8_gemv.bf16_gemv(x, w, cfg, out=out)
                graph.replay()
                torch.cuda.synchronize()
                problem = None if torch.equal(out, y) else "graph replay differs from the eager call"
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
    import bench.switch_ab as ab
    from quantroll.bench.rollout import copy_bandwidth
    from quantroll.bench.shapes import random_model, shape_config
    from quantroll.engine import SamplingParams

    cfg = shape_config("qwen3-8b", layers)
    model = random_model(cfg, "cuda")
    args = argparse.Namespace(approx=["cuda"], batches=batches, precision="bf16", shape="qwen3-8b", repeats=2,
                              device="cuda")
    prompts = [list(range(1 + 50 * i, 60 + 50 * i + 7 * i)) for i in range(4)]
    params = SamplingParams(temperature=1.0, max_new_tokens=16, stop_token_ids=(), seed=11)
    bandwidth = copy_bandwidth("cuda")
    reference_box, rows = [], []
    shipped = fp8_gemv.BF16_MAX_M
    for name, value in (("cublas", 0), ("cuda", 16)):
        fp8_gemv.BF16_MAX_M = value
        ab.measure(name, model, None, prompts, params, args, cfg, bandwidth, reference_box, rows)
    fp8_gemv.BF16_MAX_M = shipped
    print(f"\nqwen3-8b ({cfg.num_hidden_layers} layers) bf16 decode step, copy {bandwidth / 1e12:.2f} TB/s")
    for name, b, ms, xr, chk in rows:
        print(f"{name:8s} {b:5d} {ms:8.3f} ms {xr:6.2f}x roof  {chk}")


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

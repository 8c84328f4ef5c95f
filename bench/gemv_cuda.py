"""The CUDA decode GEMM (kernels/cuda/fp8_gemv.cu) against the shipped Triton decode
kernel and cuBLAS BF16, on Qwen3-8B's layer shapes; correctness first.

1. Check: every compiled variant, on small odd shapes and the 8B shapes, at M from 1 to
   64, against float64 on the same FP8 operands: each BF16 output within half a BF16 ulp
   of the float64 value plus float32-summation slack (4 sqrt(K) 2^-24 times sum |a||w|),
   bit-equal across two calls and between eager and CUDA-graph replay. Exit 1 on any miss.
2. Time (GPU time per call in a CUDA graph over 8 distinct weights, median of 20) each
   variant at M = 1, 16, 32, 64, the Triton kernel's shipped tiles and cuBLAS BF16;
   print the best variant per token-tile count and the per-layer-set totals.
3. Say where the sweep's choice differs from the shipped ``fp8_gemv.CHOICE`` (the engine
   A/B of the early launch is a GPU test: tests/kernels/test_fp8_gemv.py).

    python bench/gemv_cuda.py [--ms 1,16] [--skip-timings] [--json out.json]
"""
import argparse
import dataclasses
import itertools
import json

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.shapes import EIGHT_B_GEMMS
from quantroll.formats import get_format
from quantroll.kernels import fp8_gemv
from quantroll.kernels.fp8_linear import decode_config, fp8_gemm_decode, quantize_activation_fp8
from quantroll.bench.numerics import excess_over_bf16_rounding

FP8 = get_format("fp8")
SHAPES = EIGHT_B_GEMMS  # Qwen3-8B: qkv, o, gate_up, down as (N, K)
CHECK_SHAPES = [(16, 128), (48, 384), (96, 256), (272, 1152), (4096, 4096), (4096, 12288)]
CHECK_M = (1, 2, 5, 8, 9, 16, 17, 31, 32, 33, 64)
COPIES = 8


def operands(m, n, k, copies=1):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    aq, a_s = quantize_activation_fp8(x)
    ws = [FP8.quantize_weight((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)) for _ in range(copies)]
    return x, aq, a_s, ws


def check(aq, a_s, w, y) -> str | None:
    """None if y (BF16) is float64's value rounded, up to float32-summation slack."""
    a = aq.double() * a_s.double().repeat_interleave(128, dim=1)[:, :aq.shape[1]]
    excess = excess_over_bf16_rounding(y, a, FP8.dequantize(w).double())
    return None if excess <= 0 else f"max excess over the bound {excess:.3e}"


def repeat_and_graph_problem(run, y) -> str | None:
    """None if run() gives y's bits again when launched plainly and from a CUDA-graph
    replay (run takes out= and early=)."""
    if not torch.equal(y, run(early=False)):
        return "differs between two calls"
    out = torch.empty_like(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(out=out)
    graph.replay()
    torch.cuda.synchronize()
    return None if torch.equal(out, y) else "graph replay differs from the eager call"


def variant_problem(aq, a_s, w, run) -> str | None:
    """None if run() (a GEMM taking out= and early=) rounds the float64 product and repeats
    its bits plainly and under graph replay, else what is wrong."""
    y = run()
    return check(aq, a_s, w, y) or repeat_and_graph_problem(run, y)


def correctness() -> int:
    bad = 0
    for (n, k), m in itertools.product(CHECK_SHAPES, CHECK_M):
        _, aq, a_s, ws = operands(m, n, k)
        w = ws[0]
        for cfg in fp8_gemv.VARIANTS:
            if 8 * cfg.token_tiles < m or n % cfg.rows:
                continue
            problem = variant_problem(aq, a_s, w, lambda **kw: fp8_gemv.fp8_gemv(aq, a_s, w.data, w.scale, cfg, **kw))
            if problem:
                bad += 1
                print(f"BAD {cfg.kernel} M={m} N={n} K={k}: {problem}", flush=True)
    print(f"correctness: {bad} failures", flush=True)
    return bad


def timings(ms=(1, 16, 32, 64)):
    rows, totals = [], {}
    for (name, (n, k)), m in itertools.product(SHAPES.items(), ms):
        x, aq, a_s, ws = operands(m, n, k, COPIES)
        wbs = [FP8.dequantize(w).to(torch.bfloat16) for w in ws]
        row = {"layer": name, "m": m, "bound_us": n * k / 4.25e12 * 1e6}
        row["cublas_bf16"] = graph_time_us(lambda j: x @ wbs[j].t(), COPIES)
        tcfg = decode_config(m, n, k)
        row["triton"] = graph_time_us(lambda j: fp8_gemm_decode(aq, a_s, ws[j].data, ws[j].scale, torch.bfloat16, tcfg),
                                      COPIES)
        row["cuda"] = {}
        for cfg in fp8_gemv.VARIANTS:
            if 8 * cfg.token_tiles < m or cfg.token_tiles > 2 * fp8_gemv.token_tiles(m):
                continue
            row["cuda"][cfg.kernel] = graph_time_us(
                lambda j: fp8_gemv.fp8_gemv(aq, a_s, ws[j].data, ws[j].scale, cfg), COPIES)
        best = min(row["cuda"], key=row["cuda"].get)
        cfg = next(c for c in fp8_gemv.VARIANTS if c.kernel == best)
        row["cuda_best_plain_launch"] = graph_time_us(
            lambda j: fp8_gemv.fp8_gemv(aq, a_s, ws[j].data, ws[j].scale, cfg, early=False), COPIES)
        rows.append(row)
        for key, t in (("cublas", row["cublas_bf16"]), ("triton", row["triton"]), ("cuda", row["cuda"][best])):
            totals[(m, key)] = totals.get((m, key), 0.0) + t
        print(f"{name:8s} M={m:3d} cuBLAS bf16 {row['cublas_bf16']:6.1f} | Triton {row['triton']:6.1f} | CUDA best "
              f"{row['cuda'][best]:6.1f} {best} (no early launch {row['cuda_best_plain_launch']:6.1f}) | bytes {row['bound_us']:5.1f} | all: "
              + " ".join(f"{kname[9:]}={t:.1f}" for kname, t in row["cuda"].items()), flush=True)
    # the variant with the lowest total per token-tile count and width class
    choice = {}
    for tiles, width in itertools.product((1, 2, 4, 8), ("narrow", "wide")):
        sums = {}
        for row in rows:
            if fp8_gemv.token_tiles(row["m"]) != tiles or fp8_gemv.width_class(SHAPES[row["layer"]][0]) != width:
                continue
            for kname, t in row["cuda"].items():  # every variant timed at this M holds it
                sums[kname] = sums.get(kname, 0.0) + t
        if sums:
            best = min(sums, key=sums.get)
            cfg = next(c for c in fp8_gemv.VARIANTS if c.kernel == best)
            choice[(tiles, width)] = dataclasses.astuple(cfg)
    print("\nper 8B layer set (qkv + o + gate_up + down), us:")
    for m in ms:
        bytes_us = sum(r["bound_us"] for r in rows if r["m"] == m)
        print(f"M={m:3d} cuBLAS bf16 {totals[(m, 'cublas')]:6.1f}  Triton FP8 {totals[(m, 'triton')]:6.1f}  "
              f"CUDA FP8 {totals[(m, 'cuda')]:6.1f}  FP8 bytes at 4.25 TB/s {bytes_us:5.1f}")
    print(f"chosen ((token tiles needed, width) -> (token tiles, row tiles, warps, unroll, pipeline)): {choice}", flush=True)
    return rows, choice


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    p.add_argument("--skip-timings", action="store_true")
    p.add_argument("--ms", default="1,16,32,64", help="token rows to time")
    args = p.parse_args()
    torch.manual_seed(0)
    if not fp8_gemv.usable(torch.device("cuda")):
        raise SystemExit("the CUDA decode GEMM cannot be built here (see the warning above)")
    bad = correctness()
    shipped = dict(fp8_gemv.CHOICE)
    if not args.skip_timings:
        rows, choice = timings(tuple(int(v) for v in args.ms.split(",")))
        changed = {key: value for key, value in choice.items() if shipped.get(key) != value}
        print(f"the sweep's choice differs from fp8_gemv.CHOICE at {changed or 'no entry'}")
        if args.json:
            json.dump({"rows": rows, "choice": {f"{t},{w}": v for (t, w), v in choice.items()}}, open(args.json, "w"), indent=1)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

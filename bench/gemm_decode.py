"""The one-launch decode GEMM (fp8_decode_gemm_kernel: transposed tiles, in-kernel split-K
sum, FP8 or float16 MMA) against cuBLAS BF16, on Qwen3-8B's layer shapes at M = 1, 16, 64,
after a correctness check of every setting (accuracy and run-to-run equality).

Each time is the GPU time of one call inside a CUDA graph over 8 distinct weights (decode
runs under graphs; no call finds its weight in L2); median of 20 replays. Errors are
relative Frobenius against float64 on the same FP8 operands, with float32 output (so the
MMA's accumulation shows, not BF16 output rounding).

    python bench/gemm_decode.py [--json out.json] [--quick]

(Its --bf16 study of a BF16 decode GEMM went with that kernel, removed 2026-12-01: cuBLAS
was as fast or faster for the BF16 step; docs/history.md.)
"""
import argparse
import itertools
import json

import torch

from quantroll.bench.gemm_case import gemm_case
from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.shapes import EIGHT_B_GEMMS
from quantroll.kernels.fp8_linear import DecodeGemmConfig, decode_config, fp8_gemm_decode, quantize_activation_fp8

SHAPES = EIGHT_B_GEMMS  # Qwen3-8B: qkv, o, gate_up, down as (N, K)
COPIES = 8


def bench(fn):
    return graph_time_us(fn, COPIES)


def tag(r):
    return f"bn{r['block_n']} sk{r['split_k']} st{r['num_stages']} w{r['num_warps']}{' f16' if r['dot_f16'] else ''}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="only the default configs")
    args = p.parse_args()
    torch.manual_seed(0)
    results, bad = [], 0
    # 2 warps: Triton's mma.sync on float16-widened codes (float32-accurate); 64 rows on 4
    # warps: the warpgroup MMA, whose FP8 accumulation is narrower (float16 widening restores it)
    variants = [DecodeGemmConfig(block_n=bn, split_k=sk, dot_f16=False, num_stages=st, num_warps=nw)
                for bn, sk, st, nw in itertools.product((16, 32), (1, 2, 4, 8), (3, 5), (2, 4))]
    variants += [DecodeGemmConfig(block_n=64, split_k=sk, dot_f16=f16, num_stages=3)
                 for sk, f16 in itertools.product((1, 2, 4, 8), (True, False))]
    # 4 warps, float16-widened codes: the float16 warpgroup MMA (float32-accurate)
    variants += [DecodeGemmConfig(block_n=bn, split_k=sk, dot_f16=True, num_stages=st, num_warps=4)
                 for bn, sk, st in itertools.product((64, 128), (1, 2, 4, 8), (3, 4))]
    for (name, (n, k)), m in itertools.product(SHAPES.items(), (1, 16, 64)):
        case = gemm_case(m, n, k, COPIES)
        x, wbs, wqs, aq, a_s, err = case.x, case.weights, case.quantized, case.aq, case.a_s, case.err
        wq = wqs[0]

        row = {"layer": name, "m": m, "n": n, "k": k, "bound_us": (n * k + (n // 128) * (k // 128) * 4) / 4.25e12 * 1e6}
        row["bf16_us"] = bench(lambda j: x @ wbs[j].t())
        row["actq_us"] = bench(lambda j: quantize_activation_fp8(x))
        cfgs = [decode_config(m, n, k)] + ([] if args.quick else variants)
        row["new"] = []
        for cfg in cfgs:
            y = fp8_gemm_decode(aq, a_s, wq.data, wq.scale, torch.float32, cfg)
            e = err(y)
            again = fp8_gemm_decode(aq, a_s, wq.data, wq.scale, torch.float32, cfg)
            if e > 1e-3 or not torch.equal(y, again):
                bad += 1
                print(f"BAD {name} m={m} {cfg}: rel err {e:.2e}, repeatable {torch.equal(y, again)}")
                continue
            t = bench(lambda j: fp8_gemm_decode(aq, a_s, wqs[j].data, wqs[j].scale, torch.bfloat16, cfg))
            row["new"].append({**cfg.__dict__, "us": t, "err": e})
        default = row["new"][0]
        precise = [r for r in row["new"] if r["err"] < 1e-6]
        best = {True: min(precise, key=lambda r: r["us"]), False: min(row["new"], key=lambda r: r["us"])}
        row["default"], row["best_f16"], row["best_fp8"] = default, best[True], best[False]
        results.append(row)
        print(f"{name:8s} M={m:3d} bf16 {row['bf16_us']:6.1f} actq {row['actq_us']:4.1f} default {default['us']:6.1f} err {default['err']:.1e} | best precise "
              f"{best[True]['us']:6.1f} {tag(best[True])} err {best[True]['err']:.1e} | best any {best[False]['us']:6.1f} "
              f"{tag(best[False])} err {best[False]['err']:.1e} | bound {row['bound_us']:5.1f}", flush=True)
    print("\nlayer      M  bf16us  actq  default  best-precise  best-any  bound   (us)")
    for r in results:
        print(f"{r['layer']:8s} {r['m']:3d} {r['bf16_us']:7.1f} {r['actq_us']:5.1f} {r['default']['us']:8.1f} "
              f"{r['best_f16']['us']:9.1f} {r['best_fp8']['us']:9.1f} {r['bound_us']:6.1f}")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

"""Which FP8 GEMM should a decode step of 65-256 sequences (RL rollout batches) use?

Today M > 64 goes to cuBLAS blockwise FP8 (torch._scaled_mm) where it takes the shape,
which the 2026-11-30 RL study found barely faster than BF16 at M = 128. Candidates, on
Qwen3-8B's layer shapes at M = 128 and 256, each first checked against float64 on the
same FP8 operands (error printed: the warpgroup FP8 MMA sits ~5e-5 away, the mma.sync
and float16 paths ~1e-7):

- cuBLAS BF16 (the baseline) and cuBLAS blockwise FP8;
- the prefill Triton kernel (fp8_block_gemm_kernel) over tile settings, FP8 warpgroup
  MMA or float16 MMA;
- the decode kernel (fp8_decode_gemm_kernel) with 64-row batch tiles (mma.sync).

Times: GPU time per call inside a CUDA graph over 8 distinct weights (median of 20
replays); activation quantization excluded (the engine's norms and silu*up emit the FP8
activation). Usage: python bench/gemm_batch.py [--m 128,256] [--json out.json]
"""
import argparse
import itertools
import json

import torch

from quantroll.bench.gemm_case import gemm_case
from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.shapes import EIGHT_B_GEMMS
from quantroll.kernels.fp8_linear import (DecodeGemmConfig, PrefillGemmConfig, fp8_gemm_decode, fp8_gemm_prefill,
                                          fp8_gemm_scaled_mm, scaled_mm_supports)

SHAPES = EIGHT_B_GEMMS  # Qwen3-8B: qkv, o, gate_up, down as (N, K)
COPIES = 8


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", default="128,256")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    prefill = [PrefillGemmConfig(block_m=bm, block_n=bn, num_warps=nw, num_stages=st, dot_f16=f16)
               for bm, bn, nw, st, f16 in itertools.product((64, 128), (64, 128), (4, 8), (3, 4), (False, True))
               if not (bm == 128 and bn == 128 and nw == 4)]
    decode = [DecodeGemmConfig(block_n=bn, split_k=sk, num_warps=nw, num_stages=3)
              for bn, sk, nw in itertools.product((16, 32), (1, 2, 4), (2, 4))]
    rows, bad = [], 0
    for (name, (n, k)), m in itertools.product(SHAPES.items(), [int(v) for v in args.m.split(",")]):
        case = gemm_case(m, n, k, COPIES)
        x, wbs, wqs, aq, a_s, err = case.x, case.weights, case.quantized, case.aq, case.a_s, case.err

        row = {"layer": name, "m": m, "n": n, "k": k, "bound_us": (n * k + (n // 128) * (k // 128) * 4) / 4.25e12 * 1e6,
               "bf16_us": graph_time_us(lambda j: x @ wbs[j].t(), COPIES), "paths": []}
        if scaled_mm_supports(m, n, k):
            row["paths"].append({"path": "cublas_fp8", "err": err(fp8_gemm_scaled_mm(aq, a_s, wqs[0].data, wqs[0].scale,
                                                                                    torch.float32)),
                                 "us": graph_time_us(lambda j: fp8_gemm_scaled_mm(aq, a_s, wqs[j].data, wqs[j].scale),
                                                     COPIES)})
        for cfg in prefill:
            e = err(fp8_gemm_prefill(aq, a_s, wqs[0].data, wqs[0].scale, torch.float32, cfg))
            t = graph_time_us(lambda j: fp8_gemm_prefill(aq, a_s, wqs[j].data, wqs[j].scale, torch.bfloat16, cfg), COPIES)
            row["paths"].append({"path": "prefill", **cfg.__dict__, "err": e, "us": t})
        for cfg in decode:
            e = err(fp8_gemm_decode(aq, a_s, wqs[0].data, wqs[0].scale, torch.float32, cfg))
            t = graph_time_us(lambda j: fp8_gemm_decode(aq, a_s, wqs[j].data, wqs[j].scale, torch.bfloat16, cfg), COPIES)
            row["paths"].append({"path": "decode", **cfg.__dict__, "err": e, "us": t})
        for r in row["paths"]:
            if r["err"] > 1e-3:
                bad += 1
                print(f"BAD {name} m={m} {r}")
        ok = [r for r in row["paths"] if r["err"] <= 1e-3]
        fastest = min(ok, key=lambda r: r["us"])
        accurate = min((r for r in ok if r["err"] < 1e-6), key=lambda r: r["us"])
        cublas = next((r["us"] for r in ok if r["path"] == "cublas_fp8"), float("nan"))
        row["fastest"], row["fastest_accurate"] = fastest, accurate
        rows.append(row)
        print(f"{name:8s} M={m:4d} bf16 {row['bf16_us']:6.1f} cublas-fp8 {cublas:6.1f} | fastest {fastest['us']:6.1f} "
              f"{fastest} | fastest float32-accurate {accurate['us']:6.1f} {accurate} | bound {row['bound_us']:5.1f}",
              flush=True)
    print("\nlayer       M  bf16us  cublas-fp8  fastest  fastest-accurate  bound")
    for r in rows:
        cublas = next((p["us"] for p in r["paths"] if p["path"] == "cublas_fp8"), float("nan"))
        print(f"{r['layer']:8s} {r['m']:5d} {r['bf16_us']:7.1f} {cublas:11.1f} {r['fastest']['us']:8.1f} "
              f"{r['fastest_accurate']['us']:17.1f} {r['bound_us']:6.1f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

"""The warpgroup decode GEMM (fp8_wgmma) against the Triton decode GEMM at 17-64 rows on
Qwen3-8B's layer shapes, after a correctness check of every variant (each BF16 output
float64's value rounded, and the same bits run to run).

Times: GPU time of one call inside a CUDA graph over 8 distinct weights (no call finds its
weight in L2), median of 20 replays (quantroll.bench.graph_time); the table gives the sum
per layer set (qkv + o + gate_up + down).

    python bench/wgmma_decode.py [--ms 17,32,64] [--splits 0,1,2,4,8] [--json out.json]
"""
import argparse
import dataclasses
import json

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.formats import get_format
from quantroll.kernels import fp8_wgmma
from quantroll.kernels.fp8_linear import decode_config, fp8_gemm_decode, quantize_activation_fp8
from tests.numerics import excess_over_bf16_rounding

FP8 = get_format("fp8")
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
COPIES = 8


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ms", default="17,32,64")
    p.add_argument("--splits", default="0,1,2,4,8")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    splits = [int(v) for v in args.splits.split(",")]
    torch.manual_seed(0)
    rows, bad = [], 0
    for name, (n, k) in SHAPES.items():
        wqs = [FP8.quantize_weight((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)) for _ in range(COPIES)]
        w64 = FP8.dequantize(wqs[0]).double()
        for m in ms:
            x = (torch.randn(m, k, device="cuda") * torch.logspace(-1, 1, k, device="cuda")).to(torch.bfloat16)
            aq, a_s = quantize_activation_fp8(x)
            a64 = aq.double() * a_s.double().repeat_interleave(128, dim=1)
            row = {"layer": name, "m": m, "n": n, "k": k}
            tcfg = decode_config(n, k, m)
            row["triton_us"] = graph_time_us(lambda j: fp8_gemm_decode(aq, a_s, wqs[j].data, wqs[j].scale, torch.bfloat16, tcfg), COPIES)
            row["variants"] = {}
            for base in fp8_wgmma.VARIANTS:
                for s in splits:
                    cfg = dataclasses.replace(base, splits=s)
                    y = fp8_wgmma.fp8_wgmma(aq, a_s, wqs[0].data, wqs[0].scale, cfg)
                    excess = excess_over_bf16_rounding(y, a64, w64)
                    again = fp8_wgmma.fp8_wgmma(aq, a_s, wqs[0].data, wqs[0].scale, cfg)
                    tag = f"{cfg.kernel}_s{fp8_wgmma.launch_shape(m, n, k, cfg)[1]}"
                    if excess > 0 or not torch.equal(y, again):
                        bad += 1
                        print(f"BAD {name} m={m} {tag}: excess {excess:.3e} repeatable {torch.equal(y, again)}", flush=True)
                        continue
                    if tag in row["variants"]:
                        continue
                    row["variants"][tag] = graph_time_us(
                        lambda j: fp8_wgmma.fp8_wgmma(aq, a_s, wqs[j].data, wqs[j].scale, cfg), COPIES)
            best = min(row["variants"].items(), key=lambda kv: kv[1]) if row["variants"] else ("-", float("nan"))
            row["best"] = best
            print(f"{name:8s} M={m:3d} triton {row['triton_us']:6.1f} best wgmma {best[1]:6.1f} {best[0]}  "
                  + " ".join(f"{t.replace('fp8_wgmma_', '')}={v:.1f}" for t, v in row["variants"].items()), flush=True)
            rows.append(row)
    print("\nper layer set (qkv + o + gate_up + down), us")
    print("   M  triton  wgmma(best per shape)")
    for m in ms:
        sel = [r for r in rows if r["m"] == m]
        print(f"{m:4d} {sum(r['triton_us'] for r in sel):7.1f} {sum(r['best'][1] for r in sel):7.1f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

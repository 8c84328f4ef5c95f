"""The warpgroup-MMA decode GEMM (fp8_wgmma: every variant, several K splits) against the shipped decode GEMM (what fp8_linear.fp8_gemm takes today: the CUDA
mma.sync kernel up to 16 rows, Triton's above) on Qwen3-8B's layer shapes, after a
correctness check of every variant (each BF16 output float64's value rounded, and the
same bits run to run).

Times: GPU time of one call inside a CUDA graph over 8 distinct weights (no call finds its
weight in L2), median of 20 replays (quantroll.bench.graph_time); the table gives the sum
per layer set (qkv + o + gate_up + down) of the shipped GEMM and of the best variant per
shape (any split), and the best single variant at its default splits (what the engine
would run with it in fp8_wgmma.ENGINE_CONFIGS); last, the switch_ab.py variant that puts
the winners in, where they beat the shipped GEMM.

    python bench/wgmma_decode.py [--ms 16,32,64] [--splits 0,1,2,4] [--json out.json]
"""
import argparse
import dataclasses
import json
from collections import defaultdict

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.shapes import EIGHT_B_GEMMS
from quantroll.formats import get_format
from quantroll.kernels import fp8_wgmma
from quantroll.kernels.fp8_linear import fp8_gemm, gemm_path, quantize_activation_fp8
from tests.numerics import excess_over_bf16_rounding

FP8 = get_format("fp8")
SHAPES = EIGHT_B_GEMMS  # Qwen3-8B: qkv, o, gate_up, down as (N, K)
COPIES = 8


def silu_twin(cfg):
    """The silu twin that runs ``cfg``'s GEMM (same tile rows, warpgroups and blocks per
    multiprocessor, hence the same default splits and sums), or None."""
    return next((t for t in fp8_wgmma.SILU_VARIANTS if (t.tokens, t.warpgroups, t.min_blocks)
                 == (cfg.tokens, cfg.warpgroups, cfg.min_blocks)), None)


def config_map(ranges: dict) -> str:
    """{(lo, hi): WgmmaConfig(...)} as a switch_ab.py value (no spaces)."""
    return ",".join(f"({lo},{hi}):WgmmaConfig{dataclasses.astuple(cfg)}".replace(" ", "") for (lo, hi), cfg in ranges.items())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ms", default="16,32,64")
    p.add_argument("--splits", default="0,1,2,4")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    splits = [int(v) for v in args.splits.split(",")]
    variants = fp8_wgmma.VARIANTS
    torch.manual_seed(0)
    rows, bad = [], 0
    for name, (n, k) in SHAPES.items():
        wqs = [FP8.quantize_weight((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)) for _ in range(COPIES)]
        w64 = FP8.dequantize(wqs[0]).double()
        for m in ms:
            x = (torch.randn(m, k, device="cuda") * torch.logspace(-1, 1, k, device="cuda")).to(torch.bfloat16)
            aq, a_s = quantize_activation_fp8(x)
            a64 = aq.double() * a_s.double().repeat_interleave(128, dim=1)
            row = {"layer": name, "m": m, "n": n, "k": k, "shipped_path": gemm_path(m, n, k, aq.device)}
            row["shipped_us"] = graph_time_us(lambda j: fp8_gemm(aq, a_s, wqs[j].data, wqs[j].scale), COPIES)
            row["variants"] = {}
            for base in variants:
                if m > base.tokens or n % base.rows:
                    continue
                best, default = None, None
                for s in splits:
                    cfg = dataclasses.replace(base, splits=s)
                    used = fp8_wgmma.launch_shape(m, n, k, cfg)[1]
                    y = fp8_wgmma.fp8_wgmma(aq, a_s, wqs[0].data, wqs[0].scale, cfg)
                    excess = excess_over_bf16_rounding(y, a64, w64)
                    again = fp8_wgmma.fp8_wgmma(aq, a_s, wqs[0].data, wqs[0].scale, cfg)
                    if excess > 0 or not torch.equal(y, again):
                        bad += 1
                        print(f"BAD {name} m={m} {cfg.kernel} s{used}: excess {excess:.3e} "
                              f"repeatable {torch.equal(y, again)}", flush=True)
                        continue
                    us = graph_time_us(lambda j: fp8_wgmma.fp8_wgmma(aq, a_s, wqs[j].data, wqs[j].scale, cfg), COPIES)
                    if best is None or us < best[0]:
                        best = (us, used)
                    if s == 0:
                        default = us
                if best:
                    row["variants"][base.kernel] = best
                if default is not None:
                    row.setdefault("default_splits", {})[base.kernel] = default
            rows.append(row)
            top = sorted(row["variants"].items(), key=lambda kv: kv[1][0])[:4]
            print(f"{name:8s} M={m:3d} shipped ({row['shipped_path']}) {row['shipped_us']:6.1f} | "
                  + "  ".join(f"{kname.replace('fp8_wgmma_', '')} s{s} {us:.1f}" for kname, (us, s) in top), flush=True)
    print("\nper Qwen3-8B layer set (qkv + o + gate_up + down), us")
    print("   M  shipped  best-per-shape  best-single-variant (default splits)")
    winners = {}
    for m in ms:
        sel = [r for r in rows if r["m"] == m]
        shipped = sum(r["shipped_us"] for r in sel)
        per_shape = sum(min((v[0] for v in r["variants"].values()), default=float("nan")) for r in sel)
        single = defaultdict(float)
        for r in sel:
            for kname, us in r.get("default_splits", {}).items():
                single[kname] += us
        complete = {kname: t for kname, t in single.items() if all(kname in r.get("default_splits", {}) for r in sel)}
        best_single = min(complete.items(), key=lambda kv: kv[1]) if complete else ("-", float("nan"))
        print(f"{m:4d} {shipped:8.1f} {per_shape:15.1f} {best_single[1]:10.1f} {best_single[0]}")
        if best_single[1] < shipped:
            winners[m] = next(v for v in variants if v.kernel == best_single[0])
    if winners:
        bounds = sorted(winners)
        ranges = {(1 if i == 0 else bounds[i - 1] + 1, m): winners[m] for i, m in enumerate(bounds)}
        gemms = f"fp8_wgmma.ENGINE_CONFIGS={{{config_map(ranges)}}}"
        twins = {r: twin for r, cfg in ranges.items() if (twin := silu_twin(cfg)) is not None}
        line = f"--variant 'wgmma:{gemms}' --approx wgmma"
        if twins:  # the same GEMMs, and down_proj computing silu * up itself where a twin exists
            line += f" --variant 'wgmma_silu:{gemms},fp8_wgmma.ENGINE_SILU_CONFIGS={{{config_map(twins)}}}' --approx wgmma_silu"
        print(f"\nswitch_ab.py: {line}")
    else:
        print("\nno variant beats the shipped decode GEMM at any measured M")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

"""FP8 GEMMs at decode batches of 32-512 rows on native FP8 tensor cores (warpgroup MMA on
E4M3 operands, promoted to float32 after each 128-wide K block), against cuBLAS BF16,
cuBLAS blockwise FP8 (torch._scaled_mm) and the engine's current path, on the Qwen3-8B and
1.7B layer shapes. Every candidate is first held to the numerics rule (relative Frobenius
error against float64 on the same FP8 operands, float32 output, <= 1.5x cuBLAS blockwise's
error on those operands, 2e-4 where cuBLAS refuses the shape).

Two kernel layouts: "T" the decode kernel (weights on the MMA's 64-row side, tokens on its
narrow side, split-K summed in-kernel), "R" the row-tiled GEMM (tokens x weights tiles).
Times: one call inside a CUDA graph over 8 distinct weights, median of 20 replays.

    python bench/gemm_native_fp8.py [--json out.json] [--shapes qwen3-8b,qwen3-1.7b] [--ms 32,64,...]
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch

from quantroll.bench.gemm_case import gemm_case
from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.roofline import copy_bandwidth
from quantroll.bench.shapes import SHAPES, layer_gemm_shapes
from quantroll.kernels.fp8_linear import (DecodeGemmConfig, PrefillGemmConfig, fp8_gemm, fp8_gemm_decode,
                                          fp8_gemm_prefill, gemm_path)
from quantroll.kernels.scaled_mm import fp8_gemm_scaled_mm, scaled_mm_supports

COPIES = 8
R_CONFIGS = [PrefillGemmConfig(block_m=bm, block_n=bn, num_warps=nw, num_stages=st, dot_f16=False, imprecise_acc=128)
             for bm, bn, nw, st in ((64, 64, 4, 4), (128, 64, 4, 4))]


def t_configs(m: int) -> list[DecodeGemmConfig]:
    """Decode-kernel tiles: 64 weight rows (the widest that won in the first sweep), token
    tiles of the next power of two up to 128, split-K 1-8."""
    bm = min(128, max(32, 1 << (m - 1).bit_length()))
    return [DecodeGemmConfig(block_n=64, split_k=sk, dot_f16=False, imprecise_acc=128, num_warps=4,
                             num_stages=3 if bm == 128 else 4, block_m=bm)
            for sk in (1, 2, 4, 8)]


def describe(cfg) -> str:
    if isinstance(cfg, DecodeGemmConfig):
        return f"T bn{cfg.block_n} bm{cfg.block_m} sk{cfg.split_k} st{cfg.num_stages} w{cfg.num_warps}"
    return f"R bm{cfg.block_m} bn{cfg.block_n} st{cfg.num_stages} w{cfg.num_warps}"


def run(cfg, aq, a_s, wq, w_s, out_dtype):
    if isinstance(cfg, DecodeGemmConfig):
        return fp8_gemm_decode(aq, a_s, wq, w_s, out_dtype, cfg)
    return fp8_gemm_prefill(aq, a_s, wq, w_s, out_dtype, cfg)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--shapes", default="qwen3-8b,qwen3-1.7b")
    p.add_argument("--ms", default="32,64,96,128,192,256,384,512")
    args = p.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth("cuda")
    rows, bad = [], 0
    for shape in args.shapes.split(","):
        for (name, (n, k)), m in itertools.product(layer_gemm_shapes(SHAPES[shape]).items(),
                                                   [int(x) for x in args.ms.split(",")]):
            case = gemm_case(m, n, k, COPIES)
            x, wbs, wqs, aq, a_s, err = case.x, case.weights, case.quantized, case.aq, case.a_s, case.err

            row = {"shape": shape, "layer": name, "m": m, "n": n, "k": k,
                   "bytes_us": (n * k + m * k + 2 * m * n) / bw * 1e6, "path": gemm_path(m, n, k, aq.device)}
            row["bf16_us"] = graph_time_us(lambda j: x @ wbs[j].t(), COPIES)
            row["current_us"] = graph_time_us(lambda j: fp8_gemm(aq, a_s, wqs[j].data, wqs[j].scale), COPIES)
            row["current_err"] = err(fp8_gemm(aq, a_s, wqs[0].data, wqs[0].scale, torch.float32))
            if scaled_mm_supports(m, n, k):
                row["cublas_err"] = err(fp8_gemm_scaled_mm(aq, a_s, wqs[0].data, wqs[0].scale, torch.float32))
                row["cublas_us"] = graph_time_us(
                    lambda j: fp8_gemm_scaled_mm(aq, a_s, wqs[j].data, wqs[j].scale), COPIES)
                limit = 1.5 * row["cublas_err"]
            else:
                limit = 2e-4
            row["limit"] = limit
            row["candidates"] = []
            for cfg in t_configs(m) + (R_CONFIGS if m >= 64 else []):
                try:
                    y = run(cfg, aq, a_s, wqs[0].data, wqs[0].scale, torch.float32)
                    again = run(cfg, aq, a_s, wqs[0].data, wqs[0].scale, torch.float32)
                except Exception as exc:  # a tile the compiler refuses (shared memory)
                    print(f"skip {describe(cfg)}: {type(exc).__name__}: {str(exc)[:100]}")
                    continue
                e = err(y)
                if not e <= limit or not torch.equal(y, again):
                    bad += 1
                    print(f"FAILS RULE {shape} {name} m={m} {describe(cfg)}: err {e:.2e} limit {limit:.2e} "
                          f"repeatable {torch.equal(y, again)}")
                    continue
                us = graph_time_us(lambda j: run(cfg, aq, a_s, wqs[j].data, wqs[j].scale, torch.bfloat16), COPIES)
                row["candidates"].append({"cfg": describe(cfg), **cfg.__dict__, "kind": type(cfg).__name__,
                                          "us": us, "err": e})
            best = min(row["candidates"], key=lambda c: c["us"]) if row["candidates"] else None
            row["best"] = best
            rows.append(row)
            cub = row.get("cublas_us")
            print(f"{shape:10s} {name:7s} m={m:3d} bf16 {row['bf16_us']:7.1f} cublas8 "
                  f"{cub if cub is None else round(cub, 1)!s:>7s} current {row['current_us']:7.1f} ({row['path']}) "
                  f"best {best['us'] if best else float('nan'):7.1f} {best['cfg'] if best else '-'} "
                  f"err {best['err'] if best else float('nan'):.2e}/{limit:.2e} bytes {row['bytes_us']:6.1f}",
                  flush=True)
    print(f"\n{bad} candidate(s) failed the numerics rule")
    print("\nper layer set (sum of the four GEMMs), us:")
    print(f"{'shape':10s} {'m':>4s} {'bf16':>8s} {'current':>8s} {'best fp8':>8s} {'bytes':>7s} {'bf16/best':>9s}")
    for (shape, m), group in itertools.groupby(sorted(rows, key=lambda r: (r["shape"], r["m"])),
                                               key=lambda r: (r["shape"], r["m"])):
        group = list(group)
        tot = {key: sum(r[key] for r in group) for key in ("bf16_us", "current_us", "bytes_us")}
        best = sum(r["best"]["us"] for r in group if r["best"])
        print(f"{shape:10s} {m:4d} {tot['bf16_us']:8.1f} {tot['current_us']:8.1f} {best:8.1f} {tot['bytes_us']:7.1f} "
              f"{tot['bf16_us'] / best:9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""CUTLASS 3.x blockwise FP8 GEMMs (kernels/cutlass_gemm.py) on the Qwen3-8B and 1.7B layer
shapes, against cuBLAS blockwise FP8 (torch._scaled_mm), cuBLAS BF16 and the engine's
current FP8 path (fp8_linear.fp8_gemm), at decode and prefill batches.

(a) Correctness, every config and split at every shape and M: float32 output against
float64 of the same dequantized operands (relative Frobenius error), held to the numerics
rule (<= 1.5x cuBLAS blockwise's error on those operands, <= 2e-4 where cuBLAS refuses the
shape); the output is poisoned with NaN first, so an element left unwritten fails; a second
run must be bitwise equal. Any failure: exit status 1.
(b) Time: one call inside a CUDA graph over 8 distinct weights, median of 20 replays
(quantroll.bench.graph_time). Printed per shape and M: the best config and its time vs
cuBLAS FP8 and BF16; then per M one layer's four GEMMs (qkv, o, gate_up, down) summed,
against max(bytes / copy rate, FLOPs / FP8 peak), both measured in this job.

    python bench/gemm_cutlass.py --json out.json [--shapes qwen3-8b,qwen3-1.7b] [--ms 1,16,...]
                                 [--configs swap-128x16-sk,...] [--no-time]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch

from quantroll.bench.gemm_case import gemm_case
from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.roofline import measure_peaks
from quantroll.bench.shapes import SHAPES, layer_gemm_shapes
from quantroll.kernels import cutlass_gemm
from quantroll.kernels.fp8_linear import fp8_gemm, gemm_path
from quantroll.kernels.scaled_mm import fp8_gemm_scaled_mm, scaled_mm_supports

COPIES = 8
MS = "1,16,32,64,96,128,192,256,384,512,1024"


def variants(cfg: cutlass_gemm.CutlassGemmConfig, m: int) -> list[int]:
    """The splits a config is run with: stream-K configs with CUTLASS's heuristic (0), none
    (1), and for the swapped (decode) tiles at M <= 128 an explicit split-K of 2 and 4."""
    if not cfg.stream_k:
        return [0]
    return [0, 1, 2, 4] if cfg.swap and m <= 128 else [0, 1]


def timed(cfg: cutlass_gemm.CutlassGemmConfig, m: int) -> bool:
    """Whether a config is worth timing at M (all are checked): token tiles of 16 / 32 to
    64 / 128 rows, 64 from 16 to 512 rows, 128 from 64 rows."""
    return {16: m <= 64, 32: m <= 128, 64: 16 <= m <= 512}.get(cfg.token_tile, m >= 64)


def check(case, cfg, splits, limit) -> tuple[float, str | None]:
    """(error, None) or (error, why it fails)."""
    w = case.quantized[0]
    out = torch.full((case.aq.shape[0], w.data.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
    try:
        y = cutlass_gemm.cutlass_fp8_gemm(case.aq, case.a_s, w.data, w.scale, torch.float32, cfg, splits, out=out)
        again = cutlass_gemm.cutlass_fp8_gemm(case.aq, case.a_s, w.data, w.scale, torch.float32, cfg, splits)
    except cutlass_gemm.CutlassGemmError as exc:
        return float("nan"), f"refused: {exc}"
    if not bool(torch.isfinite(y).all()):
        return float("nan"), "NaN or unwritten outputs"
    err = case.err(y)
    if not err <= limit:
        return err, f"error {err:.3e} > limit {limit:.3e}"
    if not torch.equal(y, again):
        return err, "not repeatable run to run"
    return err, None


def run_case(shape, name, n, k, m, configs, do_time) -> tuple[dict, int]:
    case = gemm_case(m, n, k, COPIES)
    aq, a_s, ws = case.aq, case.a_s, case.quantized
    row = {"shape": shape, "layer": name, "m": m, "n": n, "k": k, "path": gemm_path(m, n, k, aq.device),
           "bytes": n * k + n * k / 4096 + m * k + m * k / 32 + 2 * m * n, "flops": 2 * m * n * k}
    if scaled_mm_supports(m, n, k):
        row["cublas_err"] = case.err(fp8_gemm_scaled_mm(aq, a_s, ws[0].data, ws[0].scale, torch.float32))
        row["limit"] = 1.5 * row["cublas_err"]
    else:
        row["limit"] = 2e-4
    row["current_err"] = case.err(fp8_gemm(aq, a_s, ws[0].data, ws[0].scale, torch.float32))
    failures, row["candidates"] = 0, []
    for cfg in configs:
        for splits in variants(cfg, m):
            err, why = check(case, cfg, splits, row["limit"])
            cand = {"config": cfg.name, "splits": splits, "err": err, "fails": why}
            if why:
                failures += 1
                print(f"FAILS {shape} {name} M={m} {cfg.name} splits {splits}: {why}", flush=True)
            elif do_time and timed(cfg, m):
                cand["us"] = graph_time_us(lambda j, c=cfg, s=splits: cutlass_gemm.cutlass_fp8_gemm(
                    aq, a_s, ws[j].data, ws[j].scale, torch.bfloat16, c, s), COPIES)
            row["candidates"].append(cand)
    if do_time:
        row["bf16_us"] = graph_time_us(lambda j: case.x @ case.weights[j].t(), COPIES)
        row["current_us"] = graph_time_us(lambda j: fp8_gemm(aq, a_s, ws[j].data, ws[j].scale), COPIES)
        if "cublas_err" in row:
            row["cublas_us"] = graph_time_us(lambda j: fp8_gemm_scaled_mm(aq, a_s, ws[j].data, ws[j].scale), COPIES)
        fast = [c for c in row["candidates"] if "us" in c]
        row["best"] = min(fast, key=lambda c: c["us"]) if fast else None
    del case
    return row, failures


def fmt(us) -> str:
    return f"{us:8.1f}" if us is not None else "       -"


def print_row(row) -> None:
    best = row.get("best")
    cub = row.get("cublas_us")
    ratio = lambda ref: f"{ref / best['us']:5.2f}x" if best and ref else "    -"  # noqa: E731
    print(f"{row['shape']:10s} {row['layer']:7s} M={row['m']:4d} best {fmt(best and best['us'])} "
          f"{(best['config'] + ' s' + str(best['splits'])) if best else '-':22s} cublas8 {fmt(cub)} ({ratio(cub)}) "
          f"bf16 {fmt(row['bf16_us'])} ({ratio(row['bf16_us'])}) current {fmt(row['current_us'])} ({row['path']}) "
          f"err {best['err'] if best else float('nan'):.2e}/{row['limit']:.2e}", flush=True)


def layer_sums(rows, peaks) -> list[dict]:
    """Per shape and M: the four GEMMs' best times summed, vs max(bytes / copy rate, FLOPs / FP8 peak)."""
    out = []
    for (shape, m), group in itertools.groupby(sorted(rows, key=lambda r: (r["shape"], r["m"])),
                                               key=lambda r: (r["shape"], r["m"])):
        group = list(group)
        if len(group) != 4 or any(r.get("best") is None for r in group):
            continue
        total = {key: sum(r[key] for r in group) for key in ("bf16_us", "current_us", "bytes", "flops")}
        best = sum(r["best"]["us"] for r in group)
        cublas = sum(r["cublas_us"] for r in group) if all("cublas_us" in r for r in group) else None
        roof = max(total["bytes"] / peaks.bandwidth, total["flops"] / peaks.fp8_flops) * 1e6
        out.append({"shape": shape, "m": m, "cutlass_best_us": best, "cublas_fp8_us": cublas,
                    "bf16_us": total["bf16_us"], "current_us": total["current_us"], "roofline_us": roof,
                    "cutlass_vs_roofline": best / roof, "bf16_vs_cutlass": total["bf16_us"] / best})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="write every number here")
    p.add_argument("--shapes", default="qwen3-8b,qwen3-1.7b")
    p.add_argument("--ms", default=MS, help="activation rows")
    p.add_argument("--configs", default=",".join(c.name for c in cutlass_gemm.CONFIGS))
    p.add_argument("--no-time", action="store_true", help="correctness only")
    args = p.parse_args()
    reason = cutlass_gemm.unavailable_reason("cuda")
    if reason:
        print(f"CUTLASS GEMMs unavailable: {reason}", file=sys.stderr)
        return 2
    configs = [cutlass_gemm.config(c) for c in args.configs.split(",")]
    torch.manual_seed(0)
    start = time.time()
    print(f"library {cutlass_gemm.library().path} on {torch.cuda.get_device_name()}", flush=True)
    peaks = measure_peaks("cuda")
    print(f"copy {peaks.bandwidth / 1e12:.2f} TB/s, FP8 peak {peaks.fp8_flops / 1e12:.0f} TFLOP/s, "
          f"BF16 {peaks.bf16_flops / 1e12:.0f} TFLOP/s", flush=True)
    rows, failures = [], 0
    for shape in args.shapes.split(","):
        for (name, (n, k)), m in itertools.product(layer_gemm_shapes(SHAPES[shape]).items(),
                                                   [int(x) for x in args.ms.split(",")]):
            row, bad = run_case(shape, name, n, k, m, configs, not args.no_time)
            rows.append(row)
            failures += bad
            if not args.no_time:
                print_row(row)
    sums = layer_sums(rows, peaks) if not args.no_time else []
    if sums:
        print("\none layer's four GEMMs (us): cutlass best / cuBLAS FP8 (- where it refuses) / BF16 / current / "
              "roofline")
        for s in sums:
            print(f"{s['shape']:10s} M={s['m']:4d} {s['cutlass_best_us']:8.1f} {fmt(s['cublas_fp8_us'])} "
                  f"{s['bf16_us']:8.1f} {s['current_us']:8.1f} {s['roofline_us']:8.1f}  "
                  f"cutlass/roofline {s['cutlass_vs_roofline']:.2f}  bf16/cutlass {s['bf16_vs_cutlass']:.2f}")
    print(f"\n{failures} config run(s) failed the numerics rule; {time.time() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "library": str(cutlass_gemm.library().path),
                       "peaks": peaks.__dict__, "rows": rows, "layer_sums": sums, "failures": failures}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

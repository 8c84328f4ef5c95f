"""The bulk-copy decode GEMM (kernels/cuda/fp8_gemv_bulk.cu) against the shipped register
kernel (fp8_gemv.cu) on Qwen3-8B's layer shapes at 1 and 16 token rows; correctness first.

1. Check: every variant, with as many blocks per multiprocessor as fit and with one, on
   small odd shapes and the 8B shapes at M = 1..16, against float64 (bench/gemv_cuda.py's
   bound), repeatable and under graph replay; and bit-equal to the register kernel with
   the same warps where that one is compiled. Exit 1 on any miss.
2. Time (GPU time per call in a CUDA graph over 8 distinct weights, median of 20) the
   shipped register variant and every bulk variant x blocks per multiprocessor (all that
   fit, 1, 2, 3); the best per (token tiles, width class) becomes fp8_gemv_bulk.CHOICE.
3. With --ab: the 8B FP8 decode step with fp8_gemv_bulk.MAX_M = 16 (those choices) against
   the shipped step (bench/switch_ab.py; tokens compared by logprob distance, since the
   chosen warps may differ from the register kernel's and so the order of the sums).

    python bench/gemv_bulk.py [--quick] [--ab] [--batches 1,16] [--layers N]
"""
import argparse
import dataclasses
import itertools

import torch

from bench.gemv_cuda import COPIES, SHAPES, operands, variant_problem
from bench.switch_ab import run_variants
from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels import fp8_gemv, fp8_gemv_bulk

CHECK_SHAPES = [(16, 128), (48, 384), (96, 640), (272, 1152), (4096, 4096), (4096, 12288), (24576, 4096)]
CHECK_M = (1, 2, 5, 8, 9, 16)
PER_SM = (0, 1, 2, 3)


def configs(per_sm_values):
    for cfg, per_sm in itertools.product(fp8_gemv_bulk.VARIANTS, per_sm_values):
        yield dataclasses.replace(cfg, blocks_per_sm=per_sm)


def correctness() -> int:
    bad = 0
    for (n, k), m in itertools.product(CHECK_SHAPES, CHECK_M):
        _, aq, a_s, ws = operands(m, n, k)
        w = ws[0]
        for cfg in configs((0, 1)):
            if not fp8_gemv_bulk.supports(aq, w.data, cfg):
                continue
            run = lambda **kw: fp8_gemv_bulk.fp8_gemv_bulk(aq, a_s, w.data, w.scale, cfg, **kw)  # noqa: E731
            problem = variant_problem(aq, a_s, w, run)
            twin = next((c for c in fp8_gemv.VARIANTS if (c.token_tiles, c.row_tiles, c.warps)
                         == (cfg.token_tiles, 1, cfg.warps)), None)
            if not problem and twin is not None and not torch.equal(
                    run(), fp8_gemv.fp8_gemv(aq, a_s, w.data, w.scale, twin)):
                problem = f"bits differ from {twin.kernel}"
            if problem:
                bad += 1
                print(f"BAD {cfg} M={m} N={n} K={k}: {problem}", flush=True)
    print(f"correctness: {bad} failures", flush=True)
    return bad


def timings(ms=(1, 16)) -> dict:
    totals, per_class = {}, {}
    for m, (name, (n, k)) in itertools.product(ms, SHAPES.items()):
        _, aq, a_s, ws = operands(m, n, k, COPIES)
        row = {"register": graph_time_us(lambda j: fp8_gemv.fp8_gemv(aq, a_s, ws[j].data, ws[j].scale), COPIES)}
        for cfg in configs(PER_SM):
            if 8 * cfg.token_tiles < m or cfg.token_tiles > fp8_gemv.token_tiles(m) or not fp8_gemv_bulk.supports(
                    aq, ws[0].data, cfg):
                continue
            row[cfg] = graph_time_us(lambda j: fp8_gemv_bulk.fp8_gemv_bulk(aq, a_s, ws[j].data, ws[j].scale, cfg),
                                     COPIES)
        best = min((key for key in row if key != "register"), key=row.get)
        print(f"{name:8s} M={m:3d} register {row['register']:6.1f} | bulk best {row[best]:6.1f} "
              f"{best.kernel} per_sm={best.blocks_per_sm} | bytes {n * k / 4.25e12 * 1e6:5.1f} | all: "
              + " ".join(f"{key.kernel[14:]}/{key.blocks_per_sm}={t:.1f}" for key, t in row.items() if key != "register"),
              flush=True)
        for key, t in row.items():
            totals[(m, key)] = totals.get((m, key), 0.0) + t
            cls = (fp8_gemv.token_tiles(m), fp8_gemv.width_class(n))
            per_class.setdefault(cls, {})
            per_class[cls][key] = per_class[cls].get(key, 0.0) + t
    print("\nper 8B layer set (qkv + o + gate_up + down), us:")
    for m in ms:
        best = min((key for (mm, key) in totals if mm == m and key != "register"), key=lambda key: totals[(m, key)])
        print(f"M={m:3d} register {totals[(m, 'register')]:6.1f}  bulk best {totals[(m, best)]:6.1f} ({best})")
    choice = {}
    for cls, sums in per_class.items():
        shared = [key for key in sums if key != "register" and all(key in s for c, s in per_class.items() if c == cls)]
        best = min(shared, key=sums.get)
        choice[cls] = best
        print(f"class {cls}: register {sums['register']:.1f} us, bulk {sums[best]:.1f} us with {best}")
    return choice


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="only the first two check shapes")
    p.add_argument("--ab", action="store_true")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--layers", type=int, default=None)
    args = p.parse_args()
    if args.quick:
        CHECK_SHAPES[:] = CHECK_SHAPES[:2] + CHECK_SHAPES[-1:]
    if correctness():
        raise SystemExit(1)
    choice = timings()
    if args.ab:
        fp8_gemv_bulk.CHOICE.update(choice)
        run_variants([("shipped", []), ("bulk", [("quantroll.kernels.fp8_gemv_bulk", "MAX_M", 16)])], ["bulk"],
                     layers=args.layers, batches=args.batches)


if __name__ == "__main__":
    main()

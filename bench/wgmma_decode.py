"""The warpgroup-MMA decode GEMM (kernels/cuda/wgmma_decode.cu, 17-64 rows) against the
shipped Triton decode GEMM on Qwen3-8B's layer shapes; correctness first.

1. Check: each launch shape (every compiled variant, split or not) on small odd
   shapes and the 8B shapes at M = 17, 32, 33, 64 against float64 on the same FP8
   operands (each BF16 output within half a BF16 ulp plus float32-summation slack),
   bit-equal across two calls and under CUDA-graph replay. Exit 1 on any miss.
2. Time (GPU time per call in a CUDA graph over 8 distinct weights, median of 20) at
   M = 32 and 64: the Triton kernel's shipped tiles, and the kernel with blocks wanted per
   launch (wgmma_decode.TARGET_BLOCKS) 264 / 396 / 528 and each compiled (stages, groups
   per stage, blocks per SM) variant.
3. With --ab (if the fastest launch shape beat Triton per layer set at the largest M, which
   it then uses): the 8B FP8 decode step at --batches with wgmma_decode.FROM_M = 17
   against off (bench/switch_ab.py's machinery; tokens compared first).

    python bench/wgmma_decode.py [--quick] [--ab] [--batches 32,64] [--layers N]
"""
import argparse
import itertools

import torch

from bench.gemv_cuda import COPIES, SHAPES, operands, variant_problem
from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels import wgmma_decode
from quantroll.kernels.fp8_linear import decode_config, fp8_gemm_decode

CHECK_SHAPES = [(64, 128), (192, 384), (1024, 12288), (4096, 4096), (6144, 4096)]
CHECK_M = (17, 32, 33, 64)


TARGETS = (264, 396, 528)


def shapes_for(n, k):
    """(label, config) launch shapes for an N x K weight."""
    out = []
    for target, (stages, gps, blocks) in itertools.product(TARGETS, wgmma_decode.VARIANTS):
        wgmma_decode.TARGET_BLOCKS, saved = target, wgmma_decode.TARGET_BLOCKS
        try:
            out.append((f"t{target}_s{stages}_g{gps}_b{blocks}", wgmma_decode.default_config(n, k, stages, gps, blocks)))
        finally:
            wgmma_decode.TARGET_BLOCKS = saved
    return out


def correctness() -> int:
    bad = 0
    for (n, k), m in itertools.product(CHECK_SHAPES, CHECK_M):
        _, aq, a_s, ws = operands(m, n, k)
        w = ws[0]
        for label, cfg in shapes_for(n, k) + [("unsplit", wgmma_decode.WgmmaConfig(4, 1, k // 128))]:
            problem = variant_problem(aq, a_s, w, lambda **kw: wgmma_decode.wgmma_decode(aq, a_s, w.data, w.scale, cfg, **kw))
            if problem:
                bad += 1
                print(f"BAD {label} {cfg} M={m} N={n} K={k}: {problem}", flush=True)
    print(f"correctness: {bad} failures", flush=True)
    return bad


def timings(ms=(32, 64)) -> tuple[dict, str]:
    """Per shape and M: the Triton kernel and every launch shape; then per 8B layer set.
    Returns the totals and the fastest launch shape at the largest M."""
    totals = {}
    for m, (name, (n, k)) in itertools.product(ms, SHAPES.items()):
        _, aq, a_s, ws = operands(m, n, k, COPIES)
        cfg = decode_config(n, k, m)
        row = {"triton": graph_time_us(lambda j: fp8_gemm_decode(aq, a_s, ws[j].data, ws[j].scale, torch.bfloat16, cfg),
                                       COPIES)}
        for label, wcfg in shapes_for(n, k):
            row[label] = graph_time_us(lambda j: wgmma_decode.wgmma_decode(aq, a_s, ws[j].data, ws[j].scale, wcfg),
                                       COPIES)
        best = min((key for key in row if key != "triton"), key=row.get)
        print(f"{name:8s} M={m:3d} Triton {row['triton']:6.1f} | wgmma best {row[best]:6.1f} ({best}) | bytes "
              f"{n * k / 4.25e12 * 1e6:5.1f} | all: " + " ".join(f"{key}={t:.1f}" for key, t in row.items()), flush=True)
        for key, t in row.items():
            totals[(m, key)] = totals.get((m, key), 0.0) + t
    print("\nper 8B layer set (qkv + o + gate_up + down), us:")
    for (m, key), t in sorted(totals.items()):
        print(f"M={m:3d} {key:16s} {t:6.1f}")
    top = max(ms)
    best = min((key for (m, key) in totals if m == top and key != "triton"), key=lambda key: totals[(top, key)])
    print(f"fastest at M={top}: {best} {totals[(top, best)]:.1f} us against Triton {totals[(top, 'triton')]:.1f}")
    return totals, best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ab", action="store_true")
    p.add_argument("--batches", default="32,64")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--skip-timings", action="store_true")
    p.add_argument("--quick", action="store_true", help="M = 64 and 264 blocks wanted only (check and timings)")
    args = p.parse_args()
    global CHECK_M, CHECK_SHAPES, TARGETS
    if args.quick:
        CHECK_M, CHECK_SHAPES, TARGETS = (64,), [(4096, 4096), (4096, 12288)], (264,)
    torch.manual_seed(0)
    if not wgmma_decode.usable(torch.device("cuda")):
        raise SystemExit("the warpgroup decode GEMM cannot run here (see the warning above)")
    bad = correctness()
    faster = False
    if not bad and not args.skip_timings:
        ms = (64,) if args.quick else (32, 64)
        totals, best = timings(ms)
        faster = totals[(max(ms), best)] < totals[(max(ms), "triton")]
        target, stages, gps, blocks = (int(v[1:]) for v in best.split("_"))
        wgmma_decode.TARGET_BLOCKS, wgmma_decode.DEFAULT_VARIANT = target, (stages, gps, blocks)
    if args.ab and not bad and (faster or args.skip_timings):
        from bench.switch_ab import run_variants

        module = "quantroll.kernels.wgmma_decode"
        run_variants([("triton", [(module, "FROM_M", 0)]), ("wgmma", [(module, "FROM_M", 17)])], ["wgmma"],
                     "qwen3-8b", args.layers, args.batches)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

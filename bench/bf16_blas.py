"""The BF16 decode GEMMs under torch's BLAS settings: cuBLAS vs cuBLASLt
(torch.backends.cuda.preferred_blas_library) x reduced-precision split-K reductions allowed
or not (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction), on Qwen3-8B's
layer shapes and lm_head at M = 1, 16, 64; then the BF16 8B decode step with the default
and with the setting of the fewest microseconds per layer set.

Correctness first: each setting's float32-accumulated product is checked against float64
(relative error within tests/numerics.float32_sum_bound(K) x 4, BF16 output); a setting
that misses is reported and not timed. Times: GPU time per call in a CUDA graph over 8
distinct weights, median of 20.

    python bench/bf16_blas.py [--batches 16,64] [--step-setting cublas,0]
"""
import argparse
import itertools

import torch
import torch.nn.functional as F

from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.rollout import bench_one, copy_bandwidth
from quantroll.bench.shapes import EIGHT_B_GEMMS, random_model, shape_config
from quantroll.engine import Engine
from tests.numerics import excess_over_bf16_rounding

SHAPES = EIGHT_B_GEMMS  # Qwen3-8B: qkv, o, gate_up, down as (N, K)
SETTINGS = list(itertools.product(("cublas", "cublaslt"), (True, False)))  # (library, reduced-precision reduction)
COPIES = 8


def apply(setting):
    library, reduced = setting
    torch.backends.cuda.preferred_blas_library(library)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced


def gemm_table(ms=(1, 16, 64)) -> dict:
    totals = {}
    for (name, (n, k)), m in itertools.product(SHAPES.items(), ms):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ws = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(COPIES)]
        row = []
        for setting in SETTINGS:
            apply(setting)
            y = F.linear(x, ws[0])
            excess = excess_over_bf16_rounding(y, x.double(), ws[0].double())
            if excess > 0:
                row.append(f"{setting}: MISS {excess:.1e}")
                continue
            t = graph_time_us(lambda j: F.linear(x, ws[j]), COPIES)
            totals[(m, setting)] = totals.get((m, setting), 0.0) + t
            row.append(f"{setting[0]}/{'red' if setting[1] else 'f32'} {t:6.1f}")
        print(f"{name:8s} M={m:3d} bytes {n * k * 2 / 4.25e12 * 1e6:5.1f} | " + " | ".join(row), flush=True)
    apply(SETTINGS[0])
    print("\nper 8B layer set, us:")
    for (m, setting), t in sorted(totals.items()):
        print(f"M={m:3d} {setting} {t:6.1f}")
    return totals


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="16,64")
    p.add_argument("--step-setting", default=None, help="LIBRARY,REDUCED (e.g. cublas,0): time this one in the "
                   "step against the default instead of the sweep's best (and skip the sweep)")
    args = p.parse_args()
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    if args.step_setting:
        library, reduced = args.step_setting.split(",")
        best = (library, reduced == "1")
    else:
        totals = gemm_table()
        best = min(SETTINGS, key=lambda s: sum(totals.get((m, s), float("inf")) for m in batches))
        print(f"fewest us per layer set at M = {batches}: {best}", flush=True)
    cfg = shape_config("qwen3-8b", None)
    model = random_model(cfg, "cuda")
    bandwidth = copy_bandwidth("cuda")
    rows = []
    for setting in dict.fromkeys([SETTINGS[0], best]):
        apply(setting)
        engine = Engine.from_model(model, None, "cuda")
        for b in batches:
            r = bench_one(engine, "qwen3-8b", cfg.num_hidden_layers, "bf16", b, 128, 256, bandwidth, 2)
            rows.append((setting, b, r.decode_step_ms, r.step_over_roofline))
            print(f"{setting} batch {b}: {r.decode_step_ms:.3f} ms ({r.step_over_roofline:.2f}x roofline)", flush=True)
        del engine
        torch.cuda.empty_cache()
    apply(SETTINGS[0])
    print("\nBF16 8B decode step (copy bandwidth %.2f TB/s)" % (bandwidth / 1e12))
    for setting, b, ms, xr in rows:
        print(f"{str(setting):24s} batch {b:3d} {ms:7.3f} ms {xr:5.2f}x roofline")


if __name__ == "__main__":
    main()

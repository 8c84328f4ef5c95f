"""Decode-size block-FP8 GEMMs on the device: which path and tile setting is fastest at
M = 1, 16, 64 on Qwen3-8B's layer shapes, against cuBLAS BF16, after a correctness check.

Paths: "fused" = activation quantized inside the GEMM (today's decode path, every program
re-quantizes its activation tile); "sep" = one activation-quantize launch, then the GEMM on
FP8 codes. Tile settings: BLOCK_N, split-K, promotion interval (imprecise_acc).

    python bench/gemm_small_m.py [--json out.json]
"""
import argparse
import itertools
import json

import torch

from quantroll.formats import get_format
from quantroll.kernels.fp8_linear import TritonGemmConfig, fp8_gemm_triton, quantize_activation_fp8

FP8 = get_format("fp8")
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


COPIES = 8  # distinct weights per timed graph: 8 x 25-100 MB, so no call finds its weight in L2


def bench(fn, reps=20):
    """GPU time of one call, us: fn(j) for j over COPIES distinct weights captured in one
    CUDA graph (decode runs under CUDA graphs, so launch overhead is not part of it);
    median of ``reps`` replays divided by COPIES."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for j in range(COPIES):
            fn(j)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(COPIES):
            fn(j)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / COPIES)
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    results, bad = [], 0
    variants = [dict(block_n=bn, split_k=sk, imprecise_acc=ia, num_stages=st)
                for bn, sk, ia, st in itertools.product((32, 64, 128), (1, 2, 4), (32, 128), (4,))]
    for (name, (n, k)), m in itertools.product(SHAPES.items(), (1, 16, 64)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        wbs = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(COPIES)]
        wqs = [FP8.quantize_weight(w) for w in wbs]
        wb, wq = wbs[0], wqs[0]
        ref = FP8.dequantize(FP8.quantize_activation(x.float())).double() @ FP8.dequantize(wq).double().t()

        def err(y):
            return ((y.double() - ref).norm() / ref.norm()).item()

        row = {"layer": name, "m": m, "n": n, "k": k}
        row["bf16_us"] = bench(lambda j: x @ wbs[j].t())
        row["fused_us"] = bench(lambda j: fp8_gemm_triton(x, None, wqs[j].data, wqs[j].scale))
        row["fused_err"] = err(fp8_gemm_triton(x, None, wq.data, wq.scale, torch.float32))
        row["actq_us"] = bench(lambda j: quantize_activation_fp8(x))
        aq, a_s = quantize_activation_fp8(x)
        best = None
        for v in variants:
            block_m = 16 if m <= 16 else 64
            cfg = TritonGemmConfig(block_m=block_m, num_warps=4, **v)
            e = err(fp8_gemm_triton(aq, a_s, wq.data, wq.scale, torch.float32, cfg))
            if e > 1e-2:
                bad += 1
                print(f"BAD {name} m={m} {v}: rel err {e:.2e}")
                continue
            t = bench(lambda j: fp8_gemm_triton(aq, a_s, wqs[j].data, wqs[j].scale, torch.bfloat16, cfg))
            row.setdefault("sep", []).append({**v, "us": t, "err": e})
            if best is None or t < best[0]:
                best = (t, v, e)
        row["sep_best_us"], row["sep_best"], row["sep_best_err"] = best
        row["bytes_fp8"] = n * k + (n // 128) * (k // 128) * 4
        row["bound_us"] = row["bytes_fp8"] / 4.27e12 * 1e6  # read-only bytes at the measured copy rate
        results.append(row)
        print(f"{name:8s} M={m:3d} bf16 {row['bf16_us']:7.1f}  fused {row['fused_us']:7.1f}  actq {row['actq_us']:5.1f}  "
              f"sep best {best[0]:7.1f} {best[1]} err {best[2]:.1e}  fused err {row['fused_err']:.1e}  "
              f"fp8 bytes bound {row['bound_us']:5.1f}", flush=True)
    print("\nlayer     M   bf16us  fusedus  actq+best  best setting")
    for r in results:
        print(f"{r['layer']:8s} {r['m']:3d} {r['bf16_us']:7.1f} {r['fused_us']:8.1f} {r['actq_us'] + r['sep_best_us']:9.1f}  "
              f"{r['sep_best']}")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

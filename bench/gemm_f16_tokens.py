"""Study: does the Triton decode GEMM at 17-64 rows get faster when the token codes arrive
already widened to float16 (exact: every e4m3 value is a float16 value)?

Why: at 64 rows a program of 32 weight rows widens 64 x 128 token codes per K block and
only 32 x 128 weight codes, so two thirds of its conversions are of the tokens, repeated
by every program. A producer (RMSNorm + quantize, silu*up + quantize) could write the codes
as float16 once. Correctness first: the float16-token outputs must equal the FP8-token
outputs of the same tiles bit for bit, and sit within the float64 bound of gemv_cuda.py.

    python bench/gemm_f16_tokens.py [--ms 16,32,64]
"""
import argparse
import itertools

import torch

from bench.gemv_cuda import COPIES, SHAPES, check, operands
from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels.fp8_linear import DecodeGemmConfig, decode_config, fp8_gemm_decode, splits_to_fill


def configs(n, k, m):
    """The shipped tiles, and a sweep with float16 dots over tile rows, warps, stages, splits."""
    yield "shipped", decode_config(n, k, m)
    for block_n, warps, stages, target in itertools.product((32, 64), (2, 4), (3, 4), (256, 512)):
        split = splits_to_fill((n + block_n - 1) // block_n, k, target)
        yield (f"n{block_n}_w{warps}_s{stages}_t{target}",
               DecodeGemmConfig(block_n=block_n, split_k=split, dot_f16=True, num_warps=warps, num_stages=stages))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ms", default="16,32,64")
    args = p.parse_args()
    torch.manual_seed(0)
    bad, totals = 0, {}
    for m in (int(v) for v in args.ms.split(",")):
        for name, (n, k) in SHAPES.items():
            _, aq, a_s, ws = operands(m, n, k, COPIES)
            a16 = aq.to(torch.float16)
            best = {}
            for label, cfg in configs(n, k, m):
                y8 = fp8_gemm_decode(aq, a_s, ws[0].data, ws[0].scale, torch.bfloat16, cfg)
                y16 = fp8_gemm_decode(a16, a_s, ws[0].data, ws[0].scale, torch.bfloat16, cfg) if cfg.dot_f16 else None
                problem = check(aq, a_s, ws[0], y8) or (
                    None if y16 is None or torch.equal(y8, y16) else "float16 tokens change the bits")
                if problem:
                    bad += 1
                    print(f"BAD {name} M={m} {label}: {problem}", flush=True)
                    continue
                t8 = graph_time_us(lambda j: fp8_gemm_decode(aq, a_s, ws[j].data, ws[j].scale, torch.bfloat16, cfg),
                                   COPIES)
                best.setdefault("fp8 tokens", (t8, label))
                best["fp8 tokens"] = min(best["fp8 tokens"], (t8, label))
                if label == "shipped":
                    best["shipped"] = (t8, label)
                if y16 is not None:
                    t16 = graph_time_us(lambda j: fp8_gemm_decode(a16, a_s, ws[j].data, ws[j].scale, torch.bfloat16,
                                                                  cfg), COPIES)
                    best["f16 tokens"] = min(best.get("f16 tokens", (t16, label)), (t16, label))
            bytes_us = n * k / 4.25e12 * 1e6
            print(f"{name:8s} M={m:3d} " + " | ".join(f"{key} {t:6.1f} ({lab})" for key, (t, lab) in best.items())
                  + f" | bytes {bytes_us:5.1f}", flush=True)
            for key, (t, _) in best.items():
                totals[(m, key)] = totals.get((m, key), 0.0) + t
    print("\nper 8B layer set, us (best per layer):")
    for (m, key), t in sorted(totals.items()):
        print(f"M={m:3d} {key:11s} {t:6.1f}")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

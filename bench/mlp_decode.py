"""The one-launch decode MLP (kernels/mlp_decode.py) against the three launches it replaces,
on Qwen3-8B's MLP (hidden 4096, intermediate 12288) at M = 1 and 16: correctness first
(bits equal to the three launches with the same down-GEMM split; float64 error), then
GPU time per MLP inside a CUDA graph over 8 distinct weight sets (no call finds its
weights in L2), median of 20 replays, over programs per SM and down-GEMM splits.
Usage: python bench/mlp_decode.py [--json out.json]
"""
import argparse
import dataclasses
import itertools
import json

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels.fp8_linear import decode_config, fp8_gemm_decode
from quantroll.kernels.fused import silu_mul
from quantroll.kernels.mlp_decode import mlp_decode, raise_on_barrier_timeout
from tests.engine.test_mlp_decode import make_case, reference

HIDDEN, INTER, COPIES = 4096, 12288, 8
BYTES = 3 * HIDDEN * INTER + 3 * (HIDDEN // 128) * (INTER // 128) * 4


def three(act, w, split):
    """The shipped three launches, the down GEMM with ``split`` K splits."""
    gu = fp8_gemm_decode(act.codes, act.scales, w[0], w[1])
    h = silu_mul(gu, quantize=True)
    cfg = dataclasses.replace(decode_config(HIDDEN, INTER, act.codes.shape[0]), split_k=split)
    return fp8_gemm_decode(h.codes, h.scales, w[2], w[3], cfg=cfg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    for m in (1, 16):
        cases = [make_case("cuda", m, HIDDEN, INTER, seed=s) for s in range(COPIES)]
        act = cases[0][0]
        ws = [c[1] for c in cases]
        ref = reference(cases[0][2], INTER).to(act.codes.device)
        shipped = decode_config(HIDDEN, INTER, m).split_k
        t3 = graph_time_us(lambda j: three(act, ws[j], shipped), COPIES)
        print(f"M={m}: three launches {t3:.1f} us (weights {BYTES / 1e6:.0f} MB)", flush=True)
        rows.append({"m": m, "path": "three launches", "split": shipped, "us": t3})
        for ctas, split in itertools.product((2, 3, 4), (shipped, 6, 8)):
            y = mlp_decode(act, *ws[0], split=split, ctas_per_sm=ctas)
            raise_on_barrier_timeout(y.device)  # a barrier that gave up: wrong outputs, stop here
            same = torch.equal(y.view(torch.int16), three(act, ws[0], split).view(torch.int16))
            err = ((y.double() - ref).norm() / ref.norm()).item()
            t = graph_time_us(lambda j: mlp_decode(act, *ws[j], split=split, ctas_per_sm=ctas), COPIES)
            rows.append({"m": m, "path": "one launch", "ctas_per_sm": ctas, "split": split, "us": t, "same_bits": same,
                         "err": err})
            print(f"  one launch, {ctas} per SM, split {split}: {t:.1f} us, same bits {same}, err {err:.1e}",
                  flush=True)
    print(f"\n{'M':>3s} {'path':28s} {'us':>7s} {'GB/s':>6s}")
    for r in rows:
        label = r["path"] + (f" {r['ctas_per_sm']}/SM split {r['split']}" if "ctas_per_sm" in r else "")
        print(f"{r['m']:3d} {label:28s} {r['us']:7.1f} {BYTES / r['us'] / 1e3:6.0f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()

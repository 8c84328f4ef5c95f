"""The two-kernel FP8 decode MLP (kernels/fp8_mlp.py) against the unfused path (fp8_gemv
gate_up, silu * up kernel, fp8_gemv down) on Qwen3-8B's MLP: correctness first, then GPU
time per MLP in a CUDA graph over 8 distinct weight sets (median of 20 replays).

1. Check: for every variant pair, the fused output equals the unfused path's on the same
   variants, bit for bit, at each M. Exit 1 on any difference.
2. Time: unfused (as the engine runs it: GEMMs launched early, silu releasing down) and
   every fused variant pair, at each M; the per-MLP floor of the weight bytes at the
   measured copy bandwidth.

    python bench/mlp_fused.py [--ms 1,16] [--hidden 4096 --inter 12288]
"""
import argparse
import sys

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.rollout import copy_bandwidth
from quantroll.formats import get_format
from quantroll.kernels import fp8_gemv, fp8_mlp, fused
from quantroll.kernels.fp8_linear import quantize_activation_fp8

COPIES = 8


def unfused(aq, a_s, gu, down, gcfg=None, dcfg=None):
    gate_up = fp8_gemv.fp8_gemv(aq, a_s, gu.data, gu.scale, gcfg)
    act = fused.silu_mul(gate_up, quantize=True)
    return fp8_gemv.fp8_gemv(act.codes, act.scales, down.data, down.scale, dcfg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ms", default="1,16")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--inter", type=int, default=12288)
    args = p.parse_args()
    fp8 = get_format("fp8")
    hidden, inter = args.hidden, args.inter
    sets = [(fp8.quantize_weight((torch.randn(2 * inter, hidden, device="cuda") * 0.05).to(torch.bfloat16)),
             fp8.quantize_weight((torch.randn(hidden, inter, device="cuda") * 0.02).to(torch.bfloat16)))
            for _ in range(COPIES)]
    bandwidth = copy_bandwidth("cuda")
    mlp_bytes = sum(t.numel() * t.element_size() for t in (sets[0][0].data, sets[0][0].scale, sets[0][1].data,
                                                           sets[0][1].scale))
    failures, rows = 0, []
    for m in (int(v) for v in args.ms.split(",")):
        x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
        aq, a_s = quantize_activation_fp8(x)
        pairs = [fp8_mlp.MlpConfig(g, d) for g in fp8_mlp.GATE_UP_VARIANTS for d in fp8_mlp.DOWN_VARIANTS
                 if m <= 8 * min(g.token_tiles, d.token_tiles) and hidden % d.rows == 0]
        for cfg in pairs:
            gu, down = sets[0]
            ref = unfused(aq, a_s, gu, down, cfg.gate_up, cfg.down)
            got = fp8_mlp.fp8_mlp(aq, a_s, gu.data, gu.scale, down.data, down.scale, cfg)
            if not torch.equal(ref, got):
                failures += 1
                print(f"M={m} {cfg.gate_up_kernel} + {cfg.down_kernel}: BITS DIFFER from the unfused path", flush=True)
        base = graph_time_us(lambda j: unfused(aq, a_s, *sets[j]), COPIES)
        rows.append((m, "unfused (shipped variants)", base))
        choice = fp8_mlp.default_config(m, hidden, inter)
        for cfg in pairs:
            us = graph_time_us(lambda j, c=cfg: fp8_mlp.fp8_mlp(aq, a_s, sets[j][0].data, sets[j][0].scale,
                                                                sets[j][1].data, sets[j][1].scale, c), COPIES)
            tag = " (choice)" if cfg == choice else ""
            rows.append((m, f"fused {cfg.gate_up_kernel[17:]} + {cfg.down_kernel[21:]}{tag}", us))
            print(f"M={m} {rows[-1][1]}: {us:.1f} us", flush=True)
    floor = mlp_bytes / bandwidth * 1e6
    print(f"\nQwen3 MLP hidden {hidden}, intermediate {inter}: {mlp_bytes / 1e6:.1f} MB of FP8 weights and scales, "
          f"{floor:.1f} us at the copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(f"{'M':>3s}  {'path':60s} {'us':>7s} {'x floor':>8s}")
    for m, name, us in rows:
        print(f"{m:3d}  {name:60s} {us:7.1f} {us / floor:8.2f}")
    if failures:
        print(f"{failures} variant pairs differ from the unfused path")
        sys.exit(1)


if __name__ == "__main__":
    main()

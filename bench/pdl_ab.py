"""Does programmatic dependent launch with L2 weight prefetch (kernels/pdl.py) speed up the
decode step? Correctness first, then an A/B on the Qwen3-8B shape.

1. The decode GEMM with PDL and prefetch gives the same bits as without, and a greedy
   FP8 / BF16 engine (CUDA graphs) gives the same tokens and logprobs with PDL on and off.
2. Decode step time (CUDA-graph replays, median of repeats) for BF16 and FP8 with PDL off,
   on without prefetch, on with several prefetch budgets, and with the fused q/k/v
   attention, at the given batches.
Usage: python bench/pdl_ab.py [--layers 36] [--batches 16,64] [--json out.json]
"""
import argparse
import json
import traceback

import torch

from quantroll.bench.rollout import bench_one, copy_bandwidth
from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.formats import get_format
from quantroll.kernels import decode_attention, fp8_linear, pdl

FP8 = get_format("fp8")


def set_variant(mode: int, budget: int, fused_attention: bool):
    pdl.MODE = mode
    fp8_linear.PREFETCH_BUDGET_BYTES = budget
    decode_attention.FUSE_QKV_ATTENTION = fused_attention


def check_gemm():
    for n, k, m in ((6144, 4096, 16), (24576, 4096, 16), (4096, 12288, 64), (4096, 4096, 1), (1000, 4096, 3)):
        w = FP8.quantize_weight((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16))
        aq, a_s = fp8_linear.quantize_activation_fp8(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        outs = []
        for mode in (0, 1, 2):
            set_variant(mode, 64 << 20, False)
            outs.append(fp8_linear.fp8_gemm_decode(aq, a_s, w.data, w.scale))
        torch.cuda.synchronize()
        same = all(torch.equal(outs[0].view(torch.int16), o.view(torch.int16)) for o in outs[1:])
        pf = fp8_linear.prefetch_row_bytes(w.data, 1, k // 128, 64 << 20)
        print(f"gemm {n}x{k} M={m}: PDL+prefetch same bits {same} (prefetch {pf} B/row at split 1)", flush=True)
        assert same


def check_engine(base, fp8m, cfg):
    prompts = torch.randint(0, cfg.vocab_size, (16, 40), generator=torch.Generator().manual_seed(0)).tolist()
    prompts = [p[: 20 + i] for i, p in enumerate(prompts)]
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=())
    for name, model, fmt in (("bf16", base, None), ("fp8", fp8m, FP8)):
        for fused in (False, True):
            res = {}
            for mode in (0, 1, 2):
                set_variant(mode, 4 << 20, fused)
                res[mode] = Engine.from_model(model, fmt, "cuda").generate(prompts, params)
            same = all(a.tokens == b.tokens and a.logprobs == b.logprobs for m in (1, 2) for a, b in zip(res[0], res[m]))
            print(f"engine {name} fused-attention {fused}: PDL on/off same tokens and logprobs {same}", flush=True)
            assert same


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--batches", default="16,64")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    check_gemm()
    small = shape_config("qwen3-8b", 3)
    sb = random_model(small, "cuda")
    check_engine(sb, random_model(small, "cuda", fmt=FP8, source=sb), small)
    del sb
    cfg = shape_config("qwen3-8b", args.layers)
    bandwidth = copy_bandwidth("cuda")
    base = random_model(cfg, "cuda")
    fp8m = random_model(cfg, "cuda", fmt=FP8, source=base)
    variants = [("bf16", 0, 0, False), ("bf16", 0, 0, True), ("bf16", 1, 0, True), ("bf16", 2, 0, True),
                ("fp8", 0, 0, False), ("fp8", 0, 0, True), ("fp8", 1, 0, True), ("fp8", 2, 0, False),
                ("fp8", 2, 0, True), ("fp8", 2, 4 << 20, True), ("fp8", 2, 12 << 20, True),
                ("bf16", 0, 0, False), ("fp8", 0, 0, False)]  # baselines again: drift check
    rows = []
    for prec, on, budget, fused in variants:
        set_variant(on, budget, fused)  # on: the PDL mode
        model, fmt = (base, None) if prec == "bf16" else (fp8m, FP8)
        try:
            engine = Engine.from_model(model, fmt, "cuda")
            for b in batches:
                r = bench_one(engine, "qwen3-8b", cfg.num_hidden_layers, prec, b, 128, 256, bandwidth, 2)
                rows.append({"precision": prec, "pdl": on, "prefetch_mb": budget >> 20, "fused_attention": fused,
                             "batch": b, "step_ms": r.decode_step_ms, "roof_ms": r.roofline_step_ms})
                print(json.dumps(rows[-1]), flush=True)
        except Exception:
            traceback.print_exc()
    print(f"\nqwen3-8b {cfg.num_hidden_layers} layers, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(f"{'prec':5s} {'pdl':>4s} {'pf MB':>5s} {'fusedattn':>9s} " + " ".join(f"{'b' + str(b) + ' ms':>9s} {'x roof':>6s}"
                                                                          for b in batches))
    for i in range(0, len(rows), len(batches)):
        g = rows[i:i + len(batches)]
        print(f"{g[0]['precision']:5s} {g[0]['pdl']:4d} {g[0]['prefetch_mb']:5d} {str(g[0]['fused_attention']):>9s} "
              + " ".join(f"{r['step_ms']:9.3f} {r['step_ms'] / r['roof_ms']:6.2f}" for r in g))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""The one-launch decode attention (decode_attention_qkv) over its launch shapes
(decode_attention.AttentionTiles) on Qwen3-8B's heads (32 q / 8 KV heads, head_dim 128).

Why: a graph profile of the 8B decode step (bench/profile_graphs.py, 2026-12-01) puts it
at ~10 us per layer at batch 16 for ~2.5 us of cache bytes; one program per (sequence,
KV head) walks all the keys, so the loop's latency, not bandwidth, sets its time.

1. Check: every shape's output (BF16 and FP8-quantized) as close to a float64 step as the
   two-launch reference path (tests/engine/test_decode_attention_fused.py's criterion).
2. Time: GPU time per call in a CUDA graph over 4 distinct caches (past L2), median of 20,
   at batch 16 and 64, context lengths spread around --ctx.

3. With --ab: the 8B FP8 decode step with the shipped shapes (tiles_for) and with each
   batch's fastest for every batch
   (bench/switch_ab.py's machinery: tokens compared to the shipped run first).
   Measured 2026-12-01: docs/PERFORMANCE.md, session 8.

    python bench/attention_tiles.py [--batches 16,64] [--ctx 256] [--ab]
"""
import argparse
import itertools

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels import decode_attention
from quantroll.kernels.decode_attention import AttentionTiles, decode_attention_qkv
from tests.engine.test_decode_attention_fused import EPS, check_case_against_fp64, make_case

SHAPES = [AttentionTiles(block_s, warps, stages)
          for block_s, warps, stages in itertools.product((32, 64, 128), (4, 8), (1, 2, 3))]
COPIES = 4


def timed(case, copies, tiles, quantize):
    caches = [(case["k_cache"].clone(), case["v_cache"].clone()) for _ in range(copies)]
    c = case

    def call(j):
        return decode_attention_qkv(c["qkv"], c["q_norm_w"], c["k_norm_w"], EPS, c["cos"], c["sin"], caches[j][0],
                                    caches[j][1], c["rows"], c["positions"], c["heads"], c["kv_heads"],
                                    c["head_dim"], quantize=quantize, tiles=tiles)
    return graph_time_us(call, copies)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="16,64")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--ab", action="store_true")
    args = p.parse_args()
    best = {}
    bad = 0
    check = make_case("cuda", [0, 1, 63, 64, 200, 511, 1000, 17], 32, 8, 128, 1024, exact_sums=False)
    for tiles in SHAPES:
        decode_attention.TILES = tiles
        try:
            check_case_against_fp64(check)
        except AssertionError as e:
            bad += 1
            print(f"BAD {tiles}: {e}", flush=True)
    decode_attention.TILES = None
    print(f"check: {bad} failures of {len(SHAPES)}", flush=True)
    for batch in (int(b) for b in args.batches.split(",")):
        gen = torch.Generator().manual_seed(batch)
        positions = (args.ctx - 64 + torch.randint(0, 128, (batch,), generator=gen)).tolist()
        case = make_case("cuda", positions, 32, 8, 128, args.ctx + 128, exact_sums=False, seed=batch)
        cache_mb = batch * args.ctx * 8 * 128 * 2 * 2 / 1e6
        rows = []
        for tiles in SHAPES:
            rows.append((timed(case, COPIES, tiles, True), timed(case, COPIES, tiles, False), tiles))
        shipped_tiles = decode_attention.tiles_for(batch * 8, torch.cuda.get_device_properties(0).multi_processor_count)
        shipped = next(r for r in rows if r[2] == shipped_tiles)
        print(f"batch {batch}, context ~{args.ctx} ({cache_mb:.1f} MB of cache read, {cache_mb / 4.25e6 * 1e6:.1f} us "
              f"at 4.25 TB/s): shipped {shipped[2]} fp8-out {shipped[0]:.1f} us, bf16-out {shipped[1]:.1f} us")
        best[batch] = min(rows, key=lambda r: r[0])[2]
        for t8, t16, tiles in sorted(rows, key=lambda r: r[0])[:8]:
            print(f"   block_s {tiles.block_s:3d} warps {tiles.num_warps} stages {tiles.num_stages}: "
                  f"fp8-out {t8:6.1f} us  bf16-out {t16:6.1f} us", flush=True)
    if args.ab and not bad:
        from bench.switch_ab import run_variants

        module = "quantroll.kernels.decode_attention"
        fastest = {t: b for b, t in best.items()}  # one run per distinct shape
        variants = [("shipped", [])] + [(f"fastest at {b}: {t.block_s}/{t.num_warps}/{t.num_stages}",
                                         [(module, "TILES", t)]) for t, b in fastest.items()]
        run_variants(variants, [name for name, _ in variants[1:]], batches=args.batches)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

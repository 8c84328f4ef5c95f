"""The one-launch decode attention at decode batches: where its time goes, and a candidate
against the shipped kernel (timing; correctness is the tests' job).

1. Parts (timing only): the shipped kernel (decode_attention_triton.py, or the source in
   --before) against copies of it with parts cut out (the key loop; the prologue's q/k
   norms, rotary, cache write and barrier; both). The cut variants compute nothing
   meaningful.
2. With --before FILE (e.g. `git show REV:quantroll/kernels/decode_attention_triton.py`):
   the working tree's kernel against FILE's at the same shapes and over other launch
   shapes, then in the 8B FP8 and BF16 decode steps at --steps (bench/switch_ab.py's
   machinery: tokens and logprobs compared first).
GPU time per call in a CUDA graph over 4 caches, median of 20.

    python bench/attention_parts.py [--before FILE [--steps 16,64]] [--batches 16,64] [--ctx 256]
"""
import argparse
import importlib.util
import pathlib
import tempfile

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.kernels import decode_attention, decode_attention_triton
from tests.engine.test_decode_attention_fused import EPS, make_case

CUTS = {
    "no loop": [("length = (pos + 1).to(tl.int32)", "length = (pos * 0).to(tl.int32)")],
    "no prologue": [("    _cache_token_kv(qkv_row", "    if False:\n        _cache_token_kv(qkv_row"),
                    ("    y1, y2 = _norm_rope_rows(tl.load(q_src,", "    y1, y2 = (tl.load(q_src,"),
                    ("tl.load(qw_ptr + offs_h), tl.load(qw_ptr + HALF + offs_h), c, s, eps, G_PAD, D, OUT)", ")"),
                    ("    tl.debug_barrier()\n", "")],
}
CUTS["neither"] = CUTS["no loop"] + CUTS["no prologue"]
MODULE = "quantroll.kernels.decode_attention_triton"
TILES = [decode_attention.AttentionTiles(*t) for t in ((64, 4, 2), (64, 4, 3), (32, 4, 3), (128, 4, 2), (64, 8, 2))]


def module_from(src: str, tmp: str, name: str):
    path = pathlib.Path(tmp) / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def times_us(c: dict, caches: list) -> list[float]:
    """The installed kernel's graph time per call on case ``c`` over ``caches``, with FP8
    and with BF16 output."""
    return [graph_time_us(lambda j: decode_attention.decode_attention_qkv(
        c["qkv"], c["q_norm_w"], c["k_norm_w"], EPS, c["cos"], c["sin"], caches[j][0], caches[j][1], c["rows"],
        c["positions"], c["heads"], c["kv_heads"], c["head_dim"], quantize=quantize), len(caches))
        for quantize in (True, False)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--before", default=None, help="a kernel source to compare the working tree's with")
    p.add_argument("--batches", default="16,64")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--steps", default="", help="with --before: batches of the 8B step A/B")
    args = p.parse_args()
    tmp = tempfile.mkdtemp()
    before_src = pathlib.Path(args.before or decode_attention_triton.__file__).read_text()
    variants = {"before": module_from(before_src, tmp, "attn_before")}
    if args.before:
        variants["after"] = decode_attention_triton
    for i, (name, cuts) in enumerate(CUTS.items()):
        src = before_src
        for old, new in cuts:
            assert old in src, old
            src = src.replace(old, new)
        variants[f"before, {name}"] = module_from(src, tmp, f"attn_cut{i}")
    shipped_kernel = decode_attention_triton.decode_attention_qkv_kernel
    for batch in (int(b) for b in args.batches.split(",")):
        gen = torch.Generator().manual_seed(batch)
        positions = (args.ctx - 64 + torch.randint(0, 128, (batch,), generator=gen)).tolist()
        c = make_case("cuda", positions, 32, 8, 128, args.ctx + 128, exact_sums=False, seed=batch)
        caches = [(c["k_cache"].clone(), c["v_cache"].clone()) for _ in range(4)]
        print(f"batch {batch}, keys ~{args.ctx} (us, FP8 / BF16 output):", flush=True)
        for name, mod in variants.items():
            decode_attention_triton.decode_attention_qkv_kernel = mod.decode_attention_qkv_kernel
            try:
                t = times_us(c, caches)
            finally:
                decode_attention_triton.decode_attention_qkv_kernel = shipped_kernel
            print(f"   {name:22s} {t[0]:6.1f} / {t[1]:6.1f}", flush=True)
        for tiles in TILES if args.before else ():  # the candidate at other launch shapes
            decode_attention.TILES = tiles
            try:
                t = times_us(c, caches)
            finally:
                decode_attention.TILES = None
            print(f"   after, {tiles.block_s} keys {tiles.num_warps} warps {tiles.num_stages} stages: "
                  f"{t[0]:6.1f} / {t[1]:6.1f}", flush=True)
    if args.before and args.steps:
        from bench.switch_ab import run_variants

        for precision in ("fp8", "bf16"):
            run_variants([("before", [(MODULE, "decode_attention_qkv_kernel",
                                       variants["before"].decode_attention_qkv_kernel)]),
                          ("after", [(MODULE, "decode_attention_qkv_kernel", shipped_kernel)])],
                         ["after"], "qwen3-8b", None, args.steps, 3, precision)


if __name__ == "__main__":
    main()

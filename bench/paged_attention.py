"""Decode attention over the paged KV cache (kernels/paged_attention.py), timed under CUDA
graph replay: BF16 vs FP8 caches, per batch and context, against the bytes it must read
(each sequence's keys and values once, FP8 scales included) at the copy bandwidth.

    python bench/paged_attention.py [--shape qwen3-1.7b] [--cases 1x4096,16x2048,64x2048,256x1024]
        [--sweep [--sweep-kv fp8_e4m3] [--sweep-layouts triton,cuda] [--sweep-keys 64,128,256]]

The first rows of each case are the engine's defaults (kernels/choices.py: an FP8 cache's
decode on the CUDA kernel, its warps and splits by its rule; its column says which).
"""

from __future__ import annotations

import argparse
import itertools
import dataclasses

import torch

from quantroll.bench.graph_time import graph_time_us
from quantroll.bench.roofline import copy_bandwidth
from quantroll.bench.shapes import shape_config
from quantroll.engine.paged_cache import AttentionBatch, PagedKVCache, kv_bytes_per_token
from quantroll.kernels import paged_attention


def drop_scale_loads() -> None:
    """Compile the kernels with every KV scale load replaced by ones (before any compile)."""
    import triton
    import triton.language as tl

    from quantroll.kernels import paged_attention_triton as kernels

    @triton.jit
    def ones(scales, slots, ok, kvh, HKV: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        return ok.to(tl.float32)

    kernels._load_scales = ones


def case(cfg, kv_dtype, batch, ctx, block_size=16, copies=4, tiles=None, splits=None, check=True):
    per_seq = -(-ctx // block_size)
    blocks = batch * per_seq + 1
    caches, batches = [], []
    for _ in range(copies):  # distinct pools so that no replay finds its keys in L2
        cache = PagedKVCache(cfg, blocks, block_size, torch.bfloat16, kv_dtype, "cuda", gpu_kernels=True)
        for t in cache.k + cache.v:
            t.view(torch.uint8).random_(0, 120)  # finite codes / bf16 values of either kind
        if cache.quantized:
            for t in cache.k_scale + cache.v_scale:
                t.uniform_(1e-3, 1e-2)
        perm = torch.randperm(blocks - 1, device="cuda")[: batch * per_seq] + 1
        tables = perm.view(batch, per_seq).to(torch.int32)
        ctx_t = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        caches.append(cache)
        batches.append(AttentionBatch(torch.zeros(batch, dtype=torch.long, device="cuda"), tables, ctx_t, None))
    q = torch.randn(batch, cfg.num_attention_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    out = paged_attention.decode_attention(q, caches[0], 0, batches[0], tiles, splits).float()
    ref = paged_attention.decode_attention(q, caches[0], 0, batches[0]).float()
    err = ((out - ref).norm() / ref.norm()).item()  # against the default tiles
    if check and not err < 1e-2:
        raise AssertionError(f"tiles {tiles}, {splits} splits: relative difference {err:.2e} from the defaults")
    us = graph_time_us(lambda j: paged_attention.decode_attention(q, caches[j], 0, batches[j], tiles, splits), copies)
    nbytes = batch * ctx * kv_bytes_per_token(cfg, kv_dtype, torch.bfloat16) / cfg.num_hidden_layers
    return us, nbytes


def sweep_variants(args) -> list[tuple[str, int, int, int, int | None]]:
    """(kernel, keys per tile, warps, stages, splits) of --sweep: the Triton tiles over the
    grid at the default splits; the CUDA FP8 kernel (its own 32-key chunks, 2 stages) at each
    of its warp counts and at its rule's, 2, 3, 4 and 8 splits (its blocks per SM differ from
    the Triton kernel's, so the waves do too)."""
    from quantroll.kernels.paged_decode_cuda import WARPS

    out = []
    for lay in args.sweep_layouts.split(","):
        if lay == "cuda":
            out += [("cuda", 32, w, 2, s) for w in WARPS for s in (None, 2, 3, 4, 8)]
        elif lay == "triton":
            out += [(lay, int(bs), w, int(st), None) for bs, w, st in
                    itertools.product(args.sweep_keys.split(","), (4, 8), args.sweep_stages.split(","))]
        else:
            raise SystemExit(f"--sweep-layouts: unknown kernel {lay!r}; use triton and/or cuda")
    return out


def default_launch(kv_dtype: str, batch: int, kv_heads: int) -> str:
    """The defaults' splits (and for the CUDA kernel its warps), as the engine launches them."""
    from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS
    from quantroll.kernels.paged_decode_cuda import warps_for

    tiles = DEFAULT_ENGINE_KERNELS.attention_tiles(kv_dtype != "bf16")
    splits = paged_attention.decode_splits(batch, kv_heads, torch.device("cuda"), tiles)
    if tiles.decode_kernel == "cuda":
        return f"{splits} cuda w{tiles.decode_warps or warps_for(batch * kv_heads * splits, torch.device('cuda'))}"
    return f"{splits} triton"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-1.7b")
    ap.add_argument("--cases", default="1x4096,4x4096,16x2048,64x2048,256x1024")
    ap.add_argument("--sweep", action="store_true",
                    help="also time decode tile variants (dot layout, keys per tile, warps, stages)")
    ap.add_argument("--sweep-kv", default="bf16,fp8_e4m3", help="the cache dtypes --sweep covers")
    ap.add_argument("--sweep-layouts", default="triton,cuda",
                    help="the decode kernels --sweep covers: triton (its tiles), cuda (the CUDA FP8-cache kernel, "
                         "kernels/paged_decode_cuda.py; FP8 caches only)")
    ap.add_argument("--sweep-keys", default="64,128", help="keys per decode tile --sweep covers")
    ap.add_argument("--sweep-stages", default="2,3,4", help="pipeline stages --sweep covers")
    ap.add_argument("--splits", default=None, help="also time these split counts (comma-separated) at the default tiles")
    ap.add_argument("--variant", choices=("none", "no-scale-loads"), default="none",
                    help="diagnostic: no-scale-loads replaces the FP8 cache's scale loads by ones (what they cost; "
                         "the result is then not attention over the cache, so the check against the defaults is off)")
    args = ap.parse_args()
    check = args.variant == "none"  # a diagnostic variant computes something else on purpose
    if not check:
        drop_scale_loads()
    cfg = dataclasses.replace(shape_config(args.shape), num_hidden_layers=1)
    bw = copy_bandwidth("cuda")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {args.shape} heads {cfg.num_attention_heads}/{cfg.num_key_value_heads}")
    print(f"{'batch':>5s} {'ctx':>6s} {'kv':9s} {'splits kernel':>15s} {'us':>8s} {'floor us':>8s} {'x floor':>7s}")
    for spec in args.cases.split(","):
        b, c = (int(x) for x in spec.split("x"))
        for kv in ("bf16", "fp8_e4m3"):
            us, nbytes = case(cfg, kv, b, c, check=check)
            floor = nbytes / bw * 1e6
            launch = default_launch(kv, b, cfg.num_key_value_heads)
            print(f"{b:5d} {c:6d} {kv:9s} {launch:>15s} {us:8.1f} {floor:8.1f} {us / floor:7.2f}", flush=True)
            for n in (int(x) for x in args.splits.split(",")) if args.splits else ():
                us, _ = case(cfg, kv, b, c, splits=n, check=check)
                print(f"      splits {n:<3d} {us:8.1f} {us / floor:7.2f}", flush=True)
            if args.sweep and kv in args.sweep_kv.split(","):
                for lay, bs, w, st, n in sweep_variants(args):
                    if lay == "cuda" and kv == "bf16":
                        continue  # the CUDA kernel reads FP8 caches only
                    tiles = dataclasses.replace(paged_attention.PagedTiles(), decode_block_s=bs, decode_warps=w,
                                                decode_stages=st, decode_kernel=lay)
                    try:
                        us, _ = case(cfg, kv, b, c, tiles=tiles, splits=n, check=check)
                    except Exception as exc:  # a tile the compiler refuses (shared memory), or a wrong result
                        print(f"      {lay} {bs=} {w=} {st=} splits={n}: {type(exc).__name__}: {str(exc)[:120]}")
                        continue
                    print(f"      {lay:6s} bs{bs:<3d} w{w} st{st} splits {n or 'default':<7} {us:8.1f} "
                          f"{us / floor:7.2f}", flush=True)


if __name__ == "__main__":
    main()

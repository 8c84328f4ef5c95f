"""The one-GPU weight update against the floor: quantize + load <= 2x one device copy of
the engine's weight bytes (embeddings and scales included).

For each shape (random weights, nothing downloaded) and engine format: a BF16 trainer
model and an engine built from it on one GPU, then per update
  copy      one device copy of a flat buffer of the engine's weight bytes (the floor's unit)
  direct    WeightSync.push on the direct path (quantroll/sync/direct.py: quantize into the
            engine's buffers by one graph replay, one graph of copy-and-flag kernels for
            the BF16 tensors)
  general   WeightSync(direct=False).push: quantize into the plan's buffers, then
            Engine.load_weights (the path before the direct one, for comparison)
medians over --reps updates after --warmup. The direct path's engine state is checked
bitwise against the general path's. Prints one JSON object and a table.
--true-on-policy: engines on the batch-invariant kernels (--true-on-policy-mode), whose
forward runs no fast GPU kernels; the update still takes the direct path.

    python bench/bench_weight_update.py --shapes qwen3-1.7b,qwen3-8b --formats fp8,bf16 [--true-on-policy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine
from quantroll.formats import get_format
from quantroll.model.kernel_config import DEFAULT_KERNELS, INVARIANT_KERNELS
from quantroll.sync import WeightSync
from quantroll.sync.copy_reference import copy_seconds, engine_weight_bytes


def _copy_ms(nbytes: int, reps: int, warmup: int) -> float:
    """One whole copy of the engine's bytes (the floor's unit; the sync's own reference copies
    in chunks so as not to hold a second engine-sized buffer)."""
    return copy_seconds(nbytes, torch.device("cuda"), reps, warmup, chunk_bytes=nbytes) * 1e3


def _fill_caches(engine) -> None:
    """What a rollout leaves behind: every emulated layer's dequantized weight cached (the
    update must drop them; with the real FP8 kernels there are none)."""
    for layer in engine.quantized_layers().values():
        if layer.backend == "emulated":
            layer.dequantized_weight()


def _push_ms(sync, named, reps: int, warmup: int) -> tuple[float, float, float]:
    for _ in range(warmup):
        sync.push(named)
    q, l, total = [], [], []
    for _ in range(reps):
        _fill_caches(sync.engine)
        torch.cuda.synchronize()
        t = time.perf_counter()
        timing = sync.push(named)
        torch.cuda.synchronize()
        total.append((time.perf_counter() - t) * 1e3)
        q.append(timing.quantize_s * 1e3)
        l.append(timing.load_s * 1e3)
    return statistics.median(q), statistics.median(l), statistics.median(total)


def bench(shape: str, fmt_name: str, layers: int | None, reps: int, warmup: int, invariant: bool = False) -> dict:
    cfg = shape_config(shape, layers)
    fmt = None if fmt_name == "bf16" else get_format(fmt_name)
    kernels = INVARIANT_KERNELS if invariant else DEFAULT_KERNELS
    trainer = random_model(cfg, "cuda")
    named = {n: p for n, p in trainer.named_parameters()}
    engine = Engine.from_model(random_model(cfg, "cuda", fmt, source=trainer), fmt, "cuda", kernels=kernels)
    reference = Engine.from_model(random_model(cfg, "cuda", fmt, source=trainer), fmt, "cuda", kernels=kernels)
    nbytes = engine_weight_bytes(engine)
    copy = _copy_ms(nbytes, reps, warmup)
    sync = WeightSync(engine, direct=True)
    dq, dl, dt = _push_ms(sync, named, reps, warmup)
    gq, gl, gt = _push_ms(WeightSync(reference, direct=False), named, reps, warmup)
    a, b = engine.state(), reference.state()
    same = all(torch.equal(a[n].reshape(-1).view(torch.uint8), b[n].reshape(-1).view(torch.uint8)) for n in b)
    out = {"shape": shape, "layers": cfg.num_hidden_layers, "format": fmt_name, "true_on_policy": invariant,
           "direct_path_taken": sync._direct is not None, "engine_weight_bytes": nbytes,
           "copy_ms": copy, "direct_quantize_ms": dq, "direct_load_ms": dl, "direct_total_ms": dt,
           "general_quantize_ms": gq, "general_load_ms": gl, "general_total_ms": gt,
           "direct_over_copy": dt / copy, "floor_2x_met": dt <= 2 * copy, "direct_bitwise_equal_general": same}
    del engine, reference, trainer, named, sync
    torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="qwen3-1.7b,qwen3-8b")
    p.add_argument("--formats", default="fp8,bf16", help="engine formats: fp8, mxfp8 (direct), nvfp4 (general path), bf16")
    p.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the real model")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--true-on-policy", action="store_true", help="engines on the batch-invariant kernels")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_weight_update.py: needs a CUDA GPU")
    rows = [bench(s, f, args.layers, args.reps, args.warmup, args.true_on_policy) for s in args.shapes.split(",") for f in args.formats.split(",")]
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": rows}, indent=1))
    print(f"{'shape':<12} {'fmt':<6} {'GiB':>6} {'copy ms':>8} {'direct ms':>9} {'(q + load)':>14} {'x copy':>7} "
          f"{'general ms':>10} {'floor':>6} {'bitwise':>7}")
    for r in rows:
        print(f"{r['shape']:<12} {r['format']:<6} {r['engine_weight_bytes'] / 2**30:>6.2f} {r['copy_ms']:>8.2f} "
              f"{r['direct_total_ms']:>9.2f} {r['direct_quantize_ms']:>6.2f} + {r['direct_load_ms']:<5.2f} "
              f"{r['direct_over_copy']:>7.2f} {r['general_total_ms']:>10.2f} {'ok' if r['floor_2x_met'] else 'MISS':>6} "
              f"{'yes' if r['direct_bitwise_equal_general'] else 'NO':>7}"
              f"{'' if r['direct_path_taken'] else '  (direct path NOT taken)'}")


if __name__ == "__main__":
    main()

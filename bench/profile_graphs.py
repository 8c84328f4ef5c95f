"""Where a decode step's GPU time goes under the engine's CUDA graphs: per-kernel GPU time
per decode step (torch.profiler; CUPTI records the kernels a graph replay launches).

The per-step figure is the difference of two generations that differ only in their
number of new tokens (prefill, capture and the first steps cancel), divided by the extra
steps. Kernel times can overlap under programmatic dependent launch, so their sum may
exceed the step; the step itself is the engine's own measurement.

    python bench/profile_graphs.py [--layers N] [--batches 16,64] [--precisions bf16,fp8]
"""
import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.formats import get_format

SHORT, LONG = 8, 40


def kernel_times(engine, prompts, new_tokens):
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=(), seed=0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.generate(prompts, params)
        torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    for e in prof.key_averages():
        if e.device_type.name == "CUDA":
            totals[e.key] += e.self_device_time_total
            counts[e.key] += e.count
    return totals, counts


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--batches", default="16,64")
    p.add_argument("--precisions", default="bf16,fp8")
    p.add_argument("--top", type=int, default=14)
    args = p.parse_args()
    cfg = shape_config("qwen3-8b", args.layers)
    base = random_model(cfg, "cuda")
    for precision in args.precisions.split(","):
        fmt = get_format("fp8") if precision == "fp8" else None
        model = base if fmt is None else random_model(cfg, "cuda", fmt=fmt, source=base)
        for batch in (int(b) for b in args.batches.split(",")):
            prompts = torch.randint(0, cfg.vocab_size, (batch, 128), generator=torch.Generator().manual_seed(0)).tolist()
            engine = Engine.from_model(model, fmt, "cuda")
            engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=LONG, stop_token_ids=()))
            step_ms = engine.last_stats["decode_step_ms"]
            short, _ = kernel_times(engine, prompts, SHORT)
            long, counts = kernel_times(engine, prompts, LONG)
            steps = LONG - SHORT
            per_step = {key: (long[key] - short.get(key, 0.0)) / steps for key in long}
            launches = {key: counts[key] for key in long}
            total = sum(per_step.values()) / 1e3
            print(f"== {precision} batch {batch} ({cfg.num_hidden_layers} layers): step {step_ms:.3f} ms; "
                  f"kernels {total:.3f} ms per step", flush=True)
            for key in sorted(per_step, key=lambda k: -per_step[k])[:args.top]:
                print(f"   {per_step[key]:8.1f} us/step  {launches[key] / (LONG + 1):7.1f}/step  {key[:100]}")
        if fmt is not None:
            del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Where a decode step's GPU time goes: per-kernel CUDA time of eager decode steps
(torch.profiler), for BF16 and FP8 engines at a few batch sizes, on N layers of the
Qwen3-8B shape. Usage: python bench/profile_decode.py [layers] [batches]"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.formats import get_format

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 8
batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,64").split(",")]
cfg = shape_config("qwen3-8b", layers)
base = random_model(cfg, "cuda")
fp8 = random_model(cfg, "cuda", fmt=get_format("fp8"), source=base)
for name, model, fmt in (("bf16", base, None), ("fp8", fp8, get_format("fp8"))):
    for batch in batches:
        prompts = torch.randint(0, cfg.vocab_size, (batch, 128)).tolist()
        params = SamplingParams(temperature=1.0, max_new_tokens=9, stop_token_ids=())
        graphed = Engine.from_model(model, fmt, "cuda")
        graphed.generate(prompts, params)
        graphed.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=64, stop_token_ids=()))
        step = graphed.last_stats["decode_step_ms"]
        eager = Engine.from_model(model, fmt, "cuda", cuda_graphs=False)
        eager.generate(prompts, params)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            eager.generate(prompts, params)
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        total = sum(e.self_device_time_total for e in events) / 1e3
        n = sum(e.count for e in events)
        print(f"== {name} batch {batch}: graph step {step:.3f} ms; eager profile: {n} kernels, {total:.2f} ms GPU "
              f"over 8 decode steps + prefill", flush=True)
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:10]:
            print(f"   {e.self_device_time_total / 1e3:8.3f} ms  {e.count:6d}x  {e.key[:90]}")

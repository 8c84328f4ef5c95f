"""The engine's host work per decode chunk, without the model: what the CPU does between two
chunks of graph replays while the GPU waits (scheduling, block growth, the chunk's inputs,
the tokens' bookkeeping), for the batch and context shapes of the RL workload and the
long-response study.

    python bench/engine_host.py [--cases 256x128,512x2048,64x16384] [--new-tokens 1024]

The model's forward and prefill are replaced by no-ops (every sampled token is 0, no stop
token), so the time is the engine's own Python and torch host calls. Each case runs one
generate() to warm up, then one timed; printed: ms per chunk of 8 decode steps. CPU only.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.engine import model_runner
from quantroll.engine.paged_cache import CacheConfig
from quantroll.engine.scheduler import SchedulerConfig

STEPS = 8  # the GPU engine's decode steps per chunk


def _no_model(runner_cls) -> None:
    def step(self, st, params):  # the decode step's bookkeeping on the device state only
        st.step += 1

    def prefill(self, chunks, params):
        return [(0, -1.0) if c.completes else None for c in chunks]

    runner_cls._step, runner_cls.prefill = step, prefill


def host_ms_per_chunk(batch: int, context: int, new_tokens: int) -> float:
    cfg = dataclasses.replace(shape_config("qwen3-1.7b", 1), hidden_size=64, intermediate_size=128,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=32, vocab_size=256,
                              max_position_embeddings=context + new_tokens + 16)
    kv_gb = batch * (context + new_tokens) * 128 * 1.3 / 2**30 + 0.01  # 128 bytes a token in this model
    engine = Engine.from_model(random_model(cfg, "cpu"), None, "cpu", cache=CacheConfig(memory_gb=kv_gb),
                               scheduler=SchedulerConfig(decode_steps=STEPS, max_num_seqs=max(batch, 1)))
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=(), seed=1)
    prompts = [[1 + i % 50] * context for i in range(batch)]
    engine.generate(prompts[:2], params)
    start = time.perf_counter()
    engine.generate(prompts, params)
    return (time.perf_counter() - start) / (new_tokens / STEPS) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="256x128,512x2048,64x16384", help="batch x prompt tokens, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(1)
    _no_model(model_runner.ModelRunner)
    print(f"{'batch':>5s} {'context':>7s} {'host ms a chunk of 8 steps':>27s}")
    for spec in args.cases.split(","):
        batch, context = (int(x) for x in spec.split("x"))
        print(f"{batch:5d} {context:7d} {host_ms_per_chunk(batch, context, args.new_tokens):27.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Where one decode step of the RL workload goes, by family: attention, each GEMM family
(q/k/v, o, gate/up, down, lm_head), and every other kernel by name, for BF16 weights + BF16
KV and FP8 weights + FP8 KV, at three points of an RL rollout (early: many short sequences;
middle; tail: a few long ones). Qwen3-8B shape, random weights.

How: an eager engine (same kernels as the graphed one, launched one by one) runs the batch
until every sequence is prefilled; the profiler then records two decode calls (8 steps
each) and nothing else. Kernels are attributed to the family whose range launched them
(forward hooks on the linears, a wrapper around the paged decode attention: a kernel whose
GPU span lies inside a range's GPU span); the rest are listed by kernel name. Beside it, the graphed engine's step time on the same batch: the
difference between that and the kernels' sum is launch gaps and host work inside the graph.

    python bench/decode_breakdown.py [--points early,middle,tail] [--json out.json]
    python bench/decode_breakdown.py --shape fib-study --points 64x2048,64x8192,64x15360  # the study's 16K rollout
"""
from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import json

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.engine import model_runner as runner_mod
from quantroll.engine.paged_cache import CacheConfig, kv_bytes_per_token
from quantroll.formats import get_format
from quantroll.kernels import paged_attention

# running sequences, context: on a GPU of >= 100 GB (H200), and of less (H100 80 GB)
POINTS = {"early": (512, 768), "middle": (128, 3072), "tail": (16, 8192)}
POINTS_80GB = {"early": (256, 1024), "middle": (64, 4096), "tail": (16, 8192)}
GEMM_PARTS = ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "gate_proj", "up_proj", "down_proj",
              "lm_head")


def family_of_linear(name: str) -> str | None:
    for part in GEMM_PARTS:
        if name.endswith(part):
            return "gemm " + part
    return None


@contextlib.contextmanager
def family_ranges(model):
    """record_function ranges around every linear and the decode attention."""
    stack, handles = [], []

    def pre(mod, args, name):
        rf = record_function("qr:" + name)
        rf.__enter__()
        stack.append(rf)

    def post(mod, args, out):
        stack.pop().__exit__(None, None, None)

    for mname, mod in model.named_modules():
        fam = family_of_linear(mname)
        if fam and type(mod).__name__ == "QLinear":
            handles.append(mod.register_forward_pre_hook(lambda m, a, f=fam: pre(m, a, f)))
            handles.append(mod.register_forward_hook(post))
    inner = paged_attention.decode_attention

    def attention(*a, **k):
        with record_function("qr:attention"):
            return inner(*a, **k)

    paged_attention.decode_attention = attention
    try:
        yield
    finally:
        paged_attention.decode_attention = inner
        for h in handles:
            h.remove()


def profile_decode(engine, prompts, new_tokens: int, calls: int = 2):
    """Per-step kernel time by (family, kernel name) over ``calls`` decode calls made when
    every sequence runs and none is being prefilled; returns (table, steps)."""
    batch = len(prompts)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    state = {"seen": 0, "steps": 0, "on": False, "prefill_inside": False}
    decode, prefill = runner_mod.ModelRunner.decode, runner_mod.ModelRunner.prefill

    def decode_wrapped(self, seqs, steps, *a, **k):
        if len(seqs) == batch and state["seen"] < calls:
            if not state["on"]:
                torch.cuda.synchronize()
                prof.start()
                state["on"] = True
            out = decode(self, seqs, steps, *a, **k)
            state["seen"] += 1
            state["steps"] += steps
            if state["seen"] == calls:
                torch.cuda.synchronize()
                prof.stop()
                state["on"] = False
            return out
        return decode(self, seqs, steps, *a, **k)

    def prefill_wrapped(self, *a, **k):
        if state["on"]:
            state["prefill_inside"] = True
        return prefill(self, *a, **k)

    runner_mod.ModelRunner.decode, runner_mod.ModelRunner.prefill = decode_wrapped, prefill_wrapped
    try:
        with family_ranges(engine.model):
            engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=()))
    finally:
        runner_mod.ModelRunner.decode, runner_mod.ModelRunner.prefill = decode, prefill
    if state["seen"] < calls or state["prefill_inside"]:
        raise RuntimeError(f"profile window not clean: {state}")
    # The profiler records each range's span on the GPU too (a device event named like the
    # range); a kernel belongs to the family whose GPU span contains it, else to "other".
    spans, kernels = [], []
    for evt in prof.events():
        if evt.device_type.name != "CUDA":
            continue
        rng = (evt.time_range.start, evt.time_range.end)
        (spans if evt.name.startswith("qr:") else kernels).append((rng, evt.name))
    spans.sort()
    starts = [rng[0] for rng, _ in spans]
    table = collections.Counter()
    for (k0, k1), name in kernels:
        i = bisect.bisect_right(starts, k0) - 1
        fam = spans[i][1][3:] if i >= 0 and k1 <= spans[i][0][1] else "other"
        table[(fam, name)] += k1 - k0
    steps = state["steps"]
    return {k: v / steps for k, v in table.items()}, steps


def graph_step_ms(engine, prompts) -> float:
    engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24, stop_token_ids=()))
    engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=()))
    return engine.last_stats["decode_step_ms"]


def short(name: str) -> str:
    return name if len(name) <= 70 else name[:67] + "..."


def parse_point(point: str, named: dict, ap: argparse.ArgumentParser) -> tuple[int, int]:
    """A named point, or BATCHxCONTEXT; anything else stops with a one-line usage error."""
    if point in named:
        return named[point]
    try:
        batch, ctx = (int(x) for x in point.split("x"))
    except ValueError:
        ap.error(f"--points: {point!r} is neither one of {', '.join(named)} nor BATCHxCONTEXT (e.g. 64x8192)")
    if batch < 1 or ctx < 64:
        ap.error(f"--points: {point!r} needs a batch >= 1 and a context >= 64 (prompts are the context less 32)")
    return batch, ctx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--points", default="early,middle,tail", help="named points, or BATCHxCONTEXT (e.g. 64x8192)")
    ap.add_argument("--pairs", default="bf16,fp8")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cfg = shape_config(args.shape, args.layers)
    results = {}
    named = POINTS if torch.cuda.get_device_properties(0).total_memory > 100 * 2**30 else POINTS_80GB
    points = {point: parse_point(point, named, ap) for point in args.points.split(",")}  # refused before any GPU work
    pairs = args.pairs.split(",")

    def models():  # one model on the GPU at a time (the FP8 one quantized from the BF16 one)
        base = random_model(cfg, "cuda")
        if "bf16" in pairs:
            yield "bf16", base, None, "bf16"
        if "fp8" in pairs:
            fp8 = random_model(cfg, "cuda", fmt=get_format("fp8"), source=base)
            del base
            torch.cuda.empty_cache()
            yield "fp8", fp8, get_format("fp8"), "fp8_e4m3"

    for pair, model, fmt, kv in models():
        for point, (batch, ctx) in points.items():
            prompt_len = ctx - 32
            gb = batch * (ctx + 48) * kv_bytes_per_token(cfg, kv, torch.bfloat16) / 2**30 * 1.1 + 1
            cache = CacheConfig(kv_cache_dtype=kv, memory_gb=gb)
            prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len)).tolist()
            graphed = Engine.from_model(model, fmt, "cuda", cache=cache)
            step = graph_step_ms(graphed, prompts)
            del graphed
            torch.cuda.empty_cache()
            eager = Engine.from_model(model, fmt, "cuda", cache=cache, cuda_graphs=False)
            table, steps = profile_decode(eager, prompts, 40)
            del eager
            torch.cuda.empty_cache()
            fams = collections.Counter()
            for (fam, _), us in table.items():
                fams[fam if fam != "other" else "other"] += us
            kernel_ms = sum(table.values()) / 1e3
            results[f"{pair}/{point}"] = {"batch": batch, "context": ctx, "graph_step_ms": step, "kernel_ms": kernel_ms,
                                          "families_us": dict(fams),
                                          "kernels_us": {f"{f} | {n}": us for (f, n), us in table.items()}}
            print(f"\n== {pair} weights + {kv} KV, {point}: {batch} running at ~{ctx} context; graphed step "
                  f"{step:.3f} ms, kernels {kernel_ms:.3f} ms (eager profile over {steps} steps)", flush=True)
            for fam, us in sorted(fams.items(), key=lambda x: -x[1]):
                print(f"   {us / 1e3:7.3f} ms {100 * us / 1e3 / step:5.1f}%  {fam}")
            for (fam, name), us in sorted(table.items(), key=lambda x: -x[1])[:25]:
                print(f"      {us:8.1f} us  {fam:18s} {short(name)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print("\nsummary (ms per decode step; graphed step, then kernel time by family)")
    fam_names = sorted({f for r in results.values() for f in r["families_us"]})
    print(f"{'run':18s} {'step':>7s} " + " ".join(f"{f[:12]:>12s}" for f in fam_names))
    for key, r in results.items():
        print(f"{key:18s} {r['graph_step_ms']:7.3f} " +
              " ".join(f"{r['families_us'].get(f, 0) / 1e3:12.3f}" for f in fam_names))


if __name__ == "__main__":
    main()

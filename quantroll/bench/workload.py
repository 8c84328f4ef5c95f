"""``quantroll bench rollout --workload rl``: the engine on the workload RL rollouts have.

N prompts x n samples (the n samples of a prompt share its prefix), each response's
length drawn once from a long-tail distribution (lognormal, sigma 1.0, its mean set to
``mean_len`` after capping at ``cap``; seed 0, so every system compared gets the same
draws) and enforced by stopping that sequence at its drawn length: random weights still
give a realistic mix of short and long sequences. For each precision (weights) x KV
cache dtype, and optionally the static policy (sub-batches that reserve the maximum
length for every row, each run until its longest row ends), it reports tokens/s,
prefill tokens saved by sharing, peak KV blocks, preemptions, and the decode time
against its serial roofline: per decode step, for each of its kernels (the decoder's
linears, the lm_head, attention), max(bytes read / copy bandwidth, FLOPs / the measured
GEMM peak of the precision that kernel runs in), summed over the steps the engine ran.
KV bytes count the cache's dtype plus its scales.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from quantroll.bench.roofline import Peaks, measure_peaks, step_roofline_s
from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import CacheConfig, Engine, SamplingParams, SchedulerConfig
from quantroll.engine.paged_cache import kv_bytes_per_token
from quantroll.formats import get_format


@dataclass(frozen=True)
class Workload:
    prompts: int = 64
    samples: int = 8
    prompt_len: int = 512
    mean_len: int = 2048
    cap: int = 8192
    sigma: float = 1.0
    seed: int = 0


def draw_lengths(w: Workload) -> list[int]:
    """n = prompts x samples response lengths: round(exp(mu + sigma z)) clipped to [1, cap],
    z standard normal (seed), mu chosen by bisection so that the clipped draws' mean is
    mean_len (within 0.5%)."""
    z = np.random.default_rng(w.seed).standard_normal(w.prompts * w.samples)

    def lengths(mu: float) -> np.ndarray:
        return np.clip(np.rint(np.exp(mu + w.sigma * z)), 1, w.cap)

    lo, hi = 0.0, math.log(w.cap) + 4 * w.sigma
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if lengths(mid).mean() < w.mean_len else (lo, mid)
    out = lengths((lo + hi) / 2).astype(int).tolist()
    return out


def workload_prompts(w: Workload, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(w.seed)
    distinct = torch.randint(0, vocab, (w.prompts, w.prompt_len), generator=g).tolist()
    return [p for p in distinct for _ in range(w.samples)]  # the samples of a prompt are consecutive, as in RL


def roofline_ms(model, trace: list[tuple[int, int, int, int]], kv_per_token: float, precision: str,
                peaks: Peaks) -> float:
    """The serial roofline of the decode steps in ``trace`` (model_runner.ModelRunner.trace),
    in milliseconds: bench/roofline.step_roofline_s of each step."""
    total = 0.0
    for n, _bucket, steps, ctx_first in trace:
        for s in range(steps):
            total += step_roofline_s(model, n, ctx_first + s * n, kv_per_token, precision, peaks)  # one key per row per step
    return total * 1e3


@dataclass
class WorkloadResult:
    shape: str
    layers: int
    precision: str
    kv_cache_dtype: str
    policy: str
    sequences: int
    tokens: int
    seconds: float
    tokens_per_s: float
    prefill_ms: float
    decode_ms: float
    decode_steps: int
    roofline_decode_ms: float
    decode_over_roofline: float
    preemptions: int
    prefill_tokens: int
    prefill_tokens_saved: int
    peak_blocks_used: int
    num_blocks: int
    peak_kv_gb: float
    kv_cache_gb: float
    graph_captures: int
    decode_attention: str  # the decode attention kernel that ran: "cuda" or "triton" (engine/plan.resolve_attention)


def run_workload(shape: str, layers: int | None, w: Workload, precisions: list[str], kv_dtypes: list[str],
                 policies: tuple[str, ...], memory_gb: float | None, device: str = "cuda",
                 kernels=None) -> tuple[Peaks, list[WorkloadResult]]:
    """``kernels``: the engines' KernelConfig (None: the engine's default)."""
    cfg = shape_config(shape, layers)
    peaks = measure_peaks(device)
    lengths = draw_lengths(w)
    prompts = workload_prompts(w, cfg.vocab_size)
    params = SamplingParams(temperature=1.0, max_new_tokens=w.cap, stop_token_ids=(), seed=1)
    base = random_model(cfg, device)
    results = []
    for precision in precisions:
        fmt = None if precision == "bf16" else get_format(precision)
        model = base if fmt is None else random_model(cfg, device, fmt=fmt, source=base)
        for kv in kv_dtypes:
            for policy in policies:
                engine = Engine.from_model(model, fmt, device, cache=CacheConfig(kv_cache_dtype=kv, memory_gb=memory_gb),
                                           scheduler=SchedulerConfig(policy=policy), kernels=kernels)
                engine.generate(prompts[: 2 * w.samples], params, [min(64, n) for n in lengths[: 2 * w.samples]])
                engine.capture_decode_graphs(params)
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = engine.generate(prompts, params, lengths)
                seconds = time.perf_counter() - start
                st = engine.last_stats
                kv_token = kv_bytes_per_token(cfg, engine.kv_cache_dtype, engine.dtype)
                roof = roofline_ms(engine.model, st["decode_trace"], kv_token, precision, peaks)
                tokens = sum(len(r.tokens) for r in out)
                r = WorkloadResult(shape, cfg.num_hidden_layers, engine.precision, engine.kv_cache_label, policy,
                                   len(prompts), tokens, seconds, tokens / seconds, st["prefill_ms"], st["decode_ms"],
                                   st["decode_steps"], roof, st["decode_ms"] / roof, st["preemptions"],
                                   st["prefill_tokens"], st["prefill_tokens_saved"], st["peak_blocks_used"],
                                   st["num_blocks"], st["peak_blocks_used"] * st["block_size"] * kv_token / 2**30,
                                   st["kv_cache_gb"], st["graph_captures"],
                                   engine.kernels.gpu.attention_tiles(kv != "bf16").decode_kernel)
                print(json.dumps(asdict(r)), flush=True)
                results.append(r)
                del engine
                torch.cuda.empty_cache()
        if model is not base:
            del model
            torch.cuda.empty_cache()
    return peaks, results


def format_workload_table(peaks: Peaks, w: Workload, results: list[WorkloadResult]) -> str:
    lengths = draw_lengths(w)
    lines = [f"workload: {w.prompts} prompts x {w.samples} samples, {w.prompt_len}-token prompts, response lengths "
             f"lognormal sigma {w.sigma} capped at {w.cap} (mean {statistics.mean(lengths):.0f}, median "
             f"{statistics.median(lengths):.0f}, max {max(lengths)}), seed {w.seed}",
             f"copy bandwidth {peaks.bandwidth / 1e12:.2f} TB/s, GEMM peak bf16 {peaks.bf16_flops / 1e12:.0f} / fp8 "
             f"{peaks.fp8_flops / 1e12:.0f} TFLOP/s",
             f"{'precision':16s} {'kv':20s} {'policy':10s} {'tok/s':>8s} {'s':>7s} {'decode ms':>9s} {'roof ms':>9s} "
             f"{'x roof':>6s} {'steps':>6s} {'preempt':>7s} {'saved':>7s} {'peak KV GiB':>11s}"]
    for r in results:
        lines.append(f"{r.precision:16s} {r.kv_cache_dtype:20s} {r.policy:10s} {r.tokens_per_s:8.0f} {r.seconds:7.1f} "
                     f"{r.decode_ms:9.0f} {r.roofline_decode_ms:9.0f} {r.decode_over_roofline:6.2f} {r.decode_steps:6d} "
                     f"{r.preemptions:7d} {r.prefill_tokens_saved:7d} {r.peak_kv_gb:11.2f}")
    base = next((r for r in results if r.precision.startswith("bfloat16") and r.kv_cache_dtype == "bf16"
                 and r.policy == "continuous"), None)
    if base is not None:
        for r in results:
            if r is not base:
                lines.append(f"{r.precision} + {r.kv_cache_dtype} KV, {r.policy}: {r.tokens_per_s / base.tokens_per_s:.2f}x "
                             "the tokens/s of bf16 + bf16 KV, continuous")
    return "\n".join(lines)

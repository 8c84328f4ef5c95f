"""``quantroll bench rollout``: prefill and decode speed of BF16 and FP8 engines on real shapes.

For each shape, precision and batch: random prompts of --prompt-len tokens, --new-tokens
generated with no stop token (every sequence runs the full length), sampled at T=1.
Reported: prefill tokens/s, decode tokens/s, the decode step time (CUDA-graph replays,
median over repeats) and the step's serial roofline (bench/roofline.py: per kernel,
max(bytes / measured copy bandwidth, FLOPs / the measured GEMM peak of its precision),
averaged over the decode steps); per shape and batch, FP8/BF16 against the ideal ratio,
the ratio of the two rooflines. For MoE the weight bytes count the experts a step is
expected to touch under uniform routing.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass

import torch

from quantroll.bench.roofline import Peaks, measure_peaks, step_roofline_s, weight_bytes_per_step
from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.formats import get_format

DEFAULT_SHAPES = ("qwen3-8b", "qwen3-1.7b")
DEFAULT_BATCHES = {"qwen3-8b": (1, 16, 64, 128, 256, 512), "qwen3-1.7b": (64, 128, 256, 512),
                   "qwen3-30b-a3b": (1, 16, 64)}


@dataclass
class RolloutResult:
    shape: str
    layers: int
    precision: str
    batch: int
    prompt_len: int
    new_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    decode_step_ms: float
    roofline_step_ms: float
    step_over_roofline: float
    weight_bytes_per_step: float
    kv_bytes_per_step: float
    decode_gemm: str = ""  # which GEMM a decode step's linear layers took (fp8: fp8_linear.gemm_path)


def kv_bytes_per_step(cfg, batch: int, prompt_len: int, new_tokens: int) -> float:
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    mean_len = prompt_len + 1 + (new_tokens - 2) / 2  # decode steps 1..new-1 read P+1 .. P+new-1 keys
    return batch * mean_len * per_token


def mean_step_roofline_ms(model, batch: int, prompt_len: int, new_tokens: int, kv_per_token: float, precision: str,
                          peaks: Peaks) -> float:
    """The serial roofline of the fixed workload's decode steps (step s reads P + s keys per
    row, s = 1 .. new-1), averaged over them."""
    steps = range(1, max(new_tokens, 2))
    total = sum(step_roofline_s(model, batch, batch * (prompt_len + s), kv_per_token, precision, peaks) for s in steps)
    return total / len(steps) * 1e3


def bench_one(engine: Engine, shape: str, layers: int, precision: str, batch: int, prompt_len: int, new_tokens: int,
              peaks: Peaks, repeats: int) -> RolloutResult:
    cfg = engine.config
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=g).tolist()
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=(), seed=1)
    engine.generate(prompts, params)  # warm-up: compile, autotune
    prefill, step = [], []
    for _ in range(repeats):
        engine.generate(prompts, params)
        prefill.append(engine.last_stats["prefill_ms"])
        step.append(engine.last_stats["decode_step_ms"])
    prefill_ms, step_ms = statistics.median(prefill), statistics.median(step)
    wb = weight_bytes_per_step(engine.model, batch)
    kvb = kv_bytes_per_step(cfg, batch, prompt_len, new_tokens)
    kind = "fp8" if engine.format is not None and engine.format.name == "fp8" else "bf16"
    roof_ms = mean_step_roofline_ms(engine.model, batch, prompt_len, new_tokens, engine.kv_bytes_per_token(), kind, peaks)
    return RolloutResult(shape, cfg.num_hidden_layers, precision, batch, prompt_len, new_tokens,
                         batch * prompt_len / prefill_ms * 1e3, batch / step_ms * 1e3, step_ms, roof_ms,
                         step_ms / roof_ms, wb, kvb)


def decode_gemm_label(precision: str, batch: int, cfg, device: str) -> str:
    """The GEMM a decode step's dense linears run on: cuBLAS for BF16, for block FP8 on FP8
    hardware fp8_linear's choice (for the hidden x hidden shape; every Qwen3 shape of the
    bench takes the same), "emulated" otherwise."""
    from quantroll.kernels.fp8_linear import fp8_hardware_available, gemm_path

    if precision == "bf16":
        return "cublas bf16"
    if precision != "fp8" or not fp8_hardware_available(device):
        return "emulated"
    return gemm_path(batch, cfg.hidden_size, cfg.hidden_size, torch.device(device))


def run_rollout_bench(shapes: list[str], layers: int | None, batches: dict[str, list[int]], precisions: list[str],
                      prompt_len: int, new_tokens: int, repeats: int,
                      device: str = "cuda") -> tuple[Peaks, list[RolloutResult]]:
    """Every shape x precision x batch of ``batches[shape]``; the peaks are measured once."""
    peaks = measure_peaks(device)
    results = []
    for shape in shapes:
        cfg = shape_config(shape, layers)
        base = random_model(cfg, device)
        for precision in precisions:
            model = base if precision == "bf16" else random_model(cfg, device, fmt=get_format(precision), source=base)
            engine = Engine.from_model(model, None if precision == "bf16" else get_format(precision), device)
            for batch in batches[shape]:
                r = bench_one(engine, shape, cfg.num_hidden_layers, engine.precision, batch, prompt_len, new_tokens,
                              peaks, repeats)
                r.decode_gemm = decode_gemm_label(precision, batch, cfg, device)
                print(json.dumps(asdict(r)), flush=True)
                results.append(r)
            del engine
            if model is not base:
                del model
            torch.cuda.empty_cache()
        del base
        torch.cuda.empty_cache()
    return peaks, results


def format_table(peaks: Peaks, results: list[RolloutResult]) -> str:
    lines = [f"copy bandwidth {peaks.bandwidth / 1e12:.2f} TB/s (read + write), GEMM peak bf16 "
             f"{peaks.bf16_flops / 1e12:.0f} / fp8 {peaks.fp8_flops / 1e12:.0f} TFLOP/s",
             f"{'shape':14s} {'L':>3s} {'precision':16s} {'batch':>5s} {'prefill tok/s':>13s} {'decode tok/s':>12s} "
             f"{'step ms':>8s} {'roof ms':>8s} {'x roof':>6s}  decode GEMM"]
    for r in results:
        lines.append(f"{r.shape:14s} {r.layers:3d} {r.precision:16s} {r.batch:5d} {r.prefill_tok_s:13.0f} "
                     f"{r.decode_tok_s:12.0f} {r.decode_step_ms:8.3f} {r.roofline_step_ms:8.3f} {r.step_over_roofline:6.2f}"
                     f"  {r.decode_gemm}")
    by = {(r.shape, r.batch, r.precision.split()[0]): r for r in results}
    for (shape, batch, prec), r in sorted(by.items()):
        if prec == "fp8" and (shape, batch, "bfloat16") in by:
            b = by[(shape, batch, "bfloat16")]
            ideal = b.roofline_step_ms / r.roofline_step_ms
            bytes_only = (b.weight_bytes_per_step + b.kv_bytes_per_step) / (r.weight_bytes_per_step + r.kv_bytes_per_step)
            got = b.decode_step_ms / r.decode_step_ms
            lines.append(f"{shape} batch {batch}: fp8/bf16 decode speedup {got:.2f}x, ideal (roofline ratio) "
                         f"{ideal:.2f}x ({100 * got / ideal:.0f}% of ideal; bytes alone {bytes_only:.2f}x)")
    return "\n".join(lines)

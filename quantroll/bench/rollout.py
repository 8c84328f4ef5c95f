"""``quantroll bench rollout``: prefill and decode speed of BF16 and FP8 engines on real shapes.

For each precision and batch: random prompts of --prompt-len tokens, --new-tokens
generated with no stop token (every sequence runs the full length), sampled at T=1.
Reported: prefill tokens/s, decode tokens/s, the decode step time (CUDA-graph
replays, median over repeats) and its roofline: the bytes one decode step must read
(every weight once, lm_head in BF16, each sequence's valid KV cache) over the
measured device-to-device copy bandwidth. For MoE the weight bytes count the experts
a step is expected to touch under uniform routing (stated in the output).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass

import torch

from quantroll.bench.shapes import random_model, shape_config
from quantroll.engine import Engine, SamplingParams
from quantroll.formats import get_format
from quantroll.model.linear import QLinear


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


def copy_bandwidth(device, nbytes: int = 4 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (median)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    return nbytes / statistics.median(times)


def weight_bytes_per_step(model, batch: int) -> float:
    cfg = model.config
    total = 0.0
    for m in model.modules():
        if not isinstance(m, QLinear) or m._fused_into:
            continue  # a fused layer's parts are views into it: counted once, with it
        n = sum(t.numel() * t.element_size() for t in (m.weight, getattr(m, "weight_scale", None),
                                                       getattr(m, "weight_global", None)) if t is not None)
        if ".experts." in m.name:
            n *= 1 - (1 - cfg.num_experts_per_tok / cfg.num_experts) ** batch  # P(expert touched)
        total += n
    return total + batch * cfg.hidden_size * 2  # embedding rows


def kv_bytes_per_step(cfg, batch: int, prompt_len: int, new_tokens: int) -> float:
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    mean_len = prompt_len + 1 + (new_tokens - 2) / 2  # decode steps 1..new-1 read P+1 .. P+new-1 keys
    return batch * mean_len * per_token


def bench_one(engine: Engine, shape: str, layers: int, precision: str, batch: int, prompt_len: int, new_tokens: int,
              bandwidth: float, repeats: int) -> RolloutResult:
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
    roof_ms = (wb + kvb) / bandwidth * 1e3
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


def run_rollout_bench(shape: str, layers: int | None, batches: list[int], precisions: list[str], prompt_len: int,
                      new_tokens: int, repeats: int, device: str = "cuda") -> tuple[float, list[RolloutResult]]:
    cfg = shape_config(shape, layers)
    bandwidth = copy_bandwidth(device)
    results = []
    base = random_model(cfg, device)
    for precision in precisions:
        if precision == "bf16":
            model = base
        else:
            model = random_model(cfg, device, fmt=get_format(precision), source=base)
        engine = Engine.from_model(model, None if precision == "bf16" else get_format(precision), device)
        label = engine.precision
        for batch in batches:
            r = bench_one(engine, shape, cfg.num_hidden_layers, label, batch, prompt_len, new_tokens, bandwidth, repeats)
            r.decode_gemm = decode_gemm_label(precision, batch, cfg, device)
            print(json.dumps(asdict(r)), flush=True)
            results.append(r)
        if model is not base:
            del engine, model
            torch.cuda.empty_cache()
    return bandwidth, results


def format_table(bandwidth: float, results: list[RolloutResult]) -> str:
    lines = [f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)",
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
            ideal = (b.weight_bytes_per_step + b.kv_bytes_per_step) / (r.weight_bytes_per_step + r.kv_bytes_per_step)
            got = b.decode_step_ms / r.decode_step_ms
            lines.append(f"{shape} batch {batch}: fp8/bf16 decode speedup {got:.2f}x, byte ratio {ideal:.2f}x "
                         f"({100 * got / ideal:.0f}% of ideal)")
    return "\n".join(lines)

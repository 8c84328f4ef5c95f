"""The serial roofline of a decode step, and the device peaks it is measured against.

A decode step's kernels run one after another, so its best possible time is the sum over
its kernels of max(bytes read / copy bandwidth, FLOPs / the GEMM peak of the precision the
kernel computes in): the decoder's linears (their weights, at the weight format's rate),
the lm_head (BF16 in every precision), and attention (the KV cache's bytes). Both
benchmarks (fixed batches and the RL workload) use it; the FP8/BF16 ratio of two such
rooflines is the ideal speedup a precision can give at that batch and context.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Peaks:
    bandwidth: float  # bytes read + written per second (device-to-device copy)
    bf16_flops: float
    fp8_flops: float


def median_ms(fn, reps: int = 10, warmup: int = 1) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream (CUDA events around each
    call), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def copy_bandwidth(device, nbytes: int = 4 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (median)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    seconds = median_ms(lambda: dst.copy_(src), repeats) / 1e3
    del src, dst
    return nbytes / seconds


def measure_peaks(device: str = "cuda", n: int = 8192) -> Peaks:
    """Copy bandwidth, and the dense BF16 and FP8 (per-row scaled, cuBLAS) GEMM rates on
    random n x n x n operands."""
    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, device=device).to(torch.bfloat16)
    bf16 = 2 * n**3 / (median_ms(lambda: a @ b.t()) / 1e3)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    sa = torch.ones(n, 1, device=device)
    sb = torch.ones(1, n, device=device)
    fp8 = 2 * n**3 / (median_ms(lambda: torch._scaled_mm(a8, b8.t(), sa, sb, out_dtype=torch.bfloat16)) / 1e3)
    return Peaks(copy_bandwidth(device), bf16, fp8)


def weight_bytes_per_step(model, batch: int) -> float:
    """Bytes of weights (codes and scales) one decode step of ``batch`` rows reads: every
    linear once (an MoE expert with the probability that one of the batch's tokens routes to
    it, uniform routing), plus the batch's embedding rows."""
    from quantroll.model.linear import QLinear

    cfg = model.config
    total = 0.0
    for m in model.modules():
        if not isinstance(m, QLinear) or m.is_fused_part:
            continue  # a fused layer's parts are views into it: counted once, with it
        n = sum(t.numel() * t.element_size() for t in (m.weight, getattr(m, "weight_scale", None),
                                                       getattr(m, "weight_global", None)) if t is not None)
        if ".experts." in m.name:
            n *= 1 - (1 - cfg.num_experts_per_tok / cfg.num_experts) ** batch  # P(expert touched)
        total += n
    return total + batch * cfg.hidden_size * 2  # embedding rows


def decoder_flops_per_token(cfg) -> float:
    """FLOPs of one token through the decoder's linears (attention projections, MLP or its
    routed experts, the router), lm_head and attention excluded."""
    dense = (cfg.hidden_size * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
             + cfg.num_attention_heads * cfg.head_dim * cfg.hidden_size)
    if cfg.num_experts:
        dense += cfg.hidden_size * cfg.num_experts  # router
        mlp = 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.num_experts_per_tok
    else:
        mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    return 2 * (dense + mlp) * cfg.num_hidden_layers


def step_roofline_s(model, batch: int, context: int, kv_per_token: float, precision: str, peaks: Peaks) -> float:
    """One decode step of ``batch`` rows whose caches hold ``context`` keys in all (summed
    over the rows), at ``kv_per_token`` bytes per key (all layers, K and V, scales included)."""
    cfg = model.config
    lm_bytes = cfg.vocab_size * cfg.hidden_size * 2
    linear_peak = peaks.fp8_flops if precision == "fp8" else peaks.bf16_flops
    weights = weight_bytes_per_step(model, batch) - lm_bytes
    attn_flops = 4 * context * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers
    return (max(weights / peaks.bandwidth, batch * decoder_flops_per_token(cfg) / linear_peak)
            + max(lm_bytes / peaks.bandwidth, 2 * batch * lm_bytes / 2 / peaks.bf16_flops)
            + max(context * kv_per_token / peaks.bandwidth, attn_flops / peaks.bf16_flops))

"""Shared machinery of the tests that turn a kernel switch on and off and compare: a call
counter for a module function, the fused forward of a model on CPU tensors (the GPU
path, run under Triton's interpreter), and FP8 engines generating with different kernel
choices (EngineKernels) on the device."""

from __future__ import annotations

import contextlib
import dataclasses

import torch


@contextlib.contextmanager
def counting(module, name: str):
    """Replace ``module.name`` by a wrapper that counts its calls; yields the count (a
    one-element list, reset by the caller as needed); restores the original on exit."""
    original = getattr(module, name)
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    setattr(module, name, counted)
    try:
        yield calls
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def switched(module, name: str, value):
    """``module.name = value`` for the block, restored after."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def fused_forward(inner, shape: tuple[int, int], vocab: int) -> torch.Tensor:
    """DecoderStack._forward_fused (the engine's GPU path, every residual add inside the next
    norm) on random token ids of ``shape`` [B, T], positions 0..T-1, CPU tensors; the
    caller makes ``layers._on_gpu`` answer True so that the GPU branches run."""
    from quantroll.model.layers import causal_attend

    ids = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(sum(shape)))
    positions = torch.arange(shape[1]).expand(shape)
    with torch.no_grad():
        x = inner.embed_tokens(ids)
        cos, sin = inner.rotary(positions, x.dtype)
        return inner._forward_fused(x, cos, sin, causal_attend, None)


def engine_results_by_kernels(choices: list, max_new_tokens: int = 12, shape: str = "qwen3-8b") -> list:
    """Results of FP8 engines on one random 2-layer model of ``shape`` (GPU), one per
    EngineKernels of ``choices``: 3 prompts of 72, 31 and 64 tokens, temperature 1, a
    fixed seed."""
    from quantroll.bench.shapes import random_model, shape_config
    from quantroll.engine import Engine, SamplingParams
    from quantroll.formats import get_format
    from quantroll.model.kernel_config import KernelConfig

    fp8 = get_format("fp8")
    cfg = dataclasses.replace(shape_config(shape, 2), vocab_size=4096)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=(), seed=5)
    prompts = [list(range(1, 73)), list(range(100, 131)), list(range(200, 264))]
    # a model per engine (random_model is seeded: the same weights), each prepared from its own plan
    return [Engine.from_model(random_model(cfg, "cuda", fmt=fp8), fp8, "cuda", kernels=KernelConfig(gpu=gpu)
                              ).generate(prompts, params)
            for gpu in choices]


def assert_same_generations(a: list, b: list) -> None:
    """The same tokens and the same logprobs, bit for bit."""
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens and x.logprobs == y.logprobs


def logprob_differences(a: list, b: list) -> list[float]:
    """|logprob differences| of two runs that must give the same tokens."""
    diffs = []
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens
        diffs += [abs(p - q) for p, q in zip(x.logprobs, y.logprobs)]
    return diffs

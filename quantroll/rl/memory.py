"""Memory figures per run: what the engine's weights take, how many tokens of KV cache
fit beside them, and the peak. Low-precision weights leave room for more KV cache,
which is part of what a precision buys on a GPU."""

from __future__ import annotations

import resource

import torch


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated (CUDA) or peak resident set of the process (CPU), GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def engine_memory(engine) -> dict[str, float]:
    """engine_weight_gb: bytes of every tensor the engine holds (codes, scales, BF16 parts).
    kv_cache_capacity_tokens: tokens the engine's KV pool holds (--kv-cache-memory-gb, or
    the default budget: a fraction of the GPU memory free when the pool is allocated)."""
    weight_bytes = sum(t.numel() * t.element_size() for t in engine.state().values())
    return {"engine_weight_gb": weight_bytes / 2**30,
            "kv_cache_capacity_tokens": float(engine.kv_cache_capacity_tokens())}

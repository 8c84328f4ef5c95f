"""Memory figures per run: what the engine's weights take, how many tokens of KV cache
fit beside them, and the peak. Low-precision weights leave room for more KV cache,
which is part of what a precision buys on a GPU."""

from __future__ import annotations

import resource

import torch

from quantroll.engine.kv_cache import kv_cache_bytes


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated (CUDA) or peak resident set of the process (CPU), GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def engine_memory(engine) -> dict[str, float]:
    """engine_weight_gb: bytes of every tensor the engine holds (codes, scales, BF16 parts).
    kv_cache_capacity_tokens: tokens of KV cache that fit in the engine's KV bound
    (--kv-cache-memory-gb) or, on a GPU without a bound, in the memory free right now."""
    weight_bytes = sum(t.numel() * t.element_size() for t in engine.state().values())
    per_token = kv_cache_bytes(engine.config, 1, 1, engine.dtype)
    budget = engine.max_kv_cache_bytes
    if budget is None and engine.device.type == "cuda":
        budget = torch.cuda.mem_get_info(engine.device)[0]
    out = {"engine_weight_gb": weight_bytes / 2**30}
    if budget is not None:
        out["kv_cache_capacity_tokens"] = float(budget // per_token)
    return out

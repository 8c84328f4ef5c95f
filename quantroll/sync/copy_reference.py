"""The unit the weight update is judged in: one device copy of the engine's weight bytes.

An update cannot be cheaper than writing every byte the engine holds once (its codes,
scales and BF16 tensors), so "quantize + load over one copy" says how far the update is
from the memory system's limit, on any device and any model size. The copy is made in
chunks of at most ``CHUNK_BYTES`` (well beyond a GPU's L2, so the rate is the memory's),
never a second engine-sized buffer beside the trainer and the engine.
"""

from __future__ import annotations

import statistics
import time

import torch

CHUNK_BYTES = 256 * 2**20


def engine_weight_bytes(engine) -> int:
    """Bytes of every tensor the engine holds as weights (quantized data, scales, BF16 parts),
    as held in memory: what an update writes (on a CPU the BF16 parts are float32 copies;
    rl/memory.py counts them as stored instead)."""
    return sum(t.numel() * t.element_size() for t in engine.state().values())


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA): every timer of a weight update
    brackets its interval with this."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_seconds(nbytes: int, device: torch.device, repeats: int = 3, warmup: int = 1,
                 chunk_bytes: int = CHUNK_BYTES) -> float:
    """Median over ``repeats`` of the time to copy ``nbytes`` on ``device``, through buffers
    of at most ``chunk_bytes`` (a benchmark that can afford it passes ``nbytes``: one copy)."""
    chunk = max(1, min(nbytes, chunk_bytes))
    src = torch.empty(chunk, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    full, rest = divmod(nbytes, chunk)

    def once() -> float:
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(full):
            dst.copy_(src)
        if rest:
            dst[:rest].copy_(src[:rest])
        synchronize(device)
        return time.perf_counter() - t0

    for _ in range(warmup):
        once()
    seconds = statistics.median(once() for _ in range(repeats))
    del src, dst
    if device.type == "cuda":  # measured once, at start-up: leave the KV pool's sizing the memory it had
        torch.cuda.empty_cache()
    return seconds

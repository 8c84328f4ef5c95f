"""Memory figures per run, in GiB (2**30 bytes): what each side's weights take as
stored, what the trainer's optimizer holds, how many tokens of KV cache fit beside
the engine's weights, and the peak. Low-precision weights leave room for more KV
cache, which is part of what a precision buys on a GPU.

"As stored" is the point: on a CPU the BF16 sides compute in float32 (quantroll/
compute.py), so the tensors in memory are float32 copies of BF16 values; counting
those would make a BF16 engine look twice its size and FP8's saving look larger than
it is. Each weight is counted at the dtype its checkpoint stores it in.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

GIB = 2**30


def peak_memory_gib(device: torch.device) -> float:
    """Peak GPU memory allocated (CUDA) or peak resident set of the process (CPU), GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def stored_dtypes(checkpoint_dir: str | Path | None) -> dict[str, torch.dtype]:
    """Tensor name -> the dtype its checkpoint stores (file headers only; {} without a directory)."""
    if checkpoint_dir is None:
        return {}
    from quantroll.checkpoint.reader import CheckpointReader
    from quantroll.checkpoint.safetensors_header import DTYPES

    with CheckpointReader(checkpoint_dir) as reader:
        return {name: DTYPES[info.dtype] for name, info in reader.tensors.items() if info.dtype in DTYPES}


def stored_bytes(tensors: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype]) -> int:
    """Bytes of ``tensors`` at their stored dtype (``dtypes`` by name), else at their own."""
    return sum(t.numel() * dtypes.get(name, t.dtype).itemsize for name, t in tensors.items())


def engine_memory(engine) -> dict[str, float]:
    """engine_weight_gib: every tensor the engine holds (codes, scales, BF16 parts) as stored.
    kv_cache_capacity_tokens: tokens the engine's KV pool holds (--kv-cache-memory-gb, or
    the default budget: a fraction of the GPU memory free when the pool is allocated); an
    estimate before the first rollout, which reports the pool it ran in (rl/rollout.py)."""
    weights = stored_bytes(engine.state(), stored_dtypes(engine.checkpoint_dir))
    out = {"engine_weight_gib": weights / GIB}
    if engine.device.type != "meta":  # a description of engines on other ranks has no pool of its own
        out["kv_cache_capacity_tokens"] = float(engine.kv_cache_capacity_tokens())
    return out


def trainer_memory(policy, trainer_dir: str | Path, optimizer) -> dict[str, float]:
    """trainer_weight_gib: the policy's parameters as its checkpoint stores them (BF16);
    trainer_optimizer_gib: what the optimizer actually holds (FP32 master weights and
    AdamW's two moments once it has stepped)."""
    params = dict(policy.named_parameters())
    held = [*optimizer.master, *(t for state in optimizer.inner.state.values() for t in state.values()
                                 if isinstance(t, torch.Tensor))]
    return {"trainer_weight_gib": stored_bytes(params, stored_dtypes(trainer_dir)) / GIB,
            "trainer_optimizer_gib": sum(t.numel() * t.element_size() for t in held) / GIB}

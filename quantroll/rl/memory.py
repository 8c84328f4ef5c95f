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

import math
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


# -- before the run: does it fit? ------------------------------------------------------
# Sizes have no upper bound of their own (--rollout-batch-size 1e9 used to grow memory
# until the machine swapped), so a run whose memory cannot fit is refused before any
# work, with the estimate. The estimate is a lower bound, each term the least the run
# must hold at once, so that only what surely cannot fit is refused:
#   weights     every parameter held by the engine (2 bytes), the trainer (2) and AdamW
#               (FP32 master + two moments + the gradient: 16)
#   KV pool     --kv-cache-memory-gb, or the CPU default of 1 GiB (a GPU's default adapts
#               to what is free, so it is not counted)
#   logits      one trainer micro-batch's float32 logits: sequences x tokens x vocabulary
#   rollout     what one rollout's samples hold on the host: their tokens and logprobs
#               (16 bytes a token) and ~200 bytes a sample, and the problem pools (~200
#               bytes a problem)
# where a sequence has at least its response (--rollout-max-response-len) and one prompt
# token. On a CPU everything is host memory (MemAvailable); on a GPU the first three are
# device memory (the card's total) and the last is host memory.

_BYTES_PER_PARAM = 2 + 2 + 16
_HOST_BYTES_PER_SAMPLE, _HOST_BYTES_PER_TOKEN, _HOST_BYTES_PER_PROBLEM = 200, 16, 200


def estimate_gib(cfg, params: int, vocab_size: int, shards: int = 1) -> dict[str, float]:
    """The least memory (GiB) one process of a run of ``cfg`` (a TrainConfig) holds at once,
    by part; ``shards``: the trainer ranks that split the trainer's weights, optimizer and
    micro-batches (1: one process)."""
    r, o = cfg.rollout, cfg.optimizer
    samples = r.rollout_batch_size * r.n_samples_per_prompt
    tokens = r.rollout_max_response_len + 1
    micro = o.micro_batch_size or o.global_batch_size or samples
    kv = cfg.engine.kv_cache_memory_gb
    if kv is None:
        kv = 1.0 if str(cfg.models.device).startswith("cpu") else 0.0
    problems = r.train_problems + r.eval_size
    engine, trainer = 2, _BYTES_PER_PARAM - 2
    return {"weights": params * (engine + trainer / shards) / GIB, "kv_pool": float(kv),
            "logits": max(1, min(micro, samples) // shards) * tokens * vocab_size * 4 / GIB,
            "rollout": (samples * (_HOST_BYTES_PER_SAMPLE + tokens * _HOST_BYTES_PER_TOKEN)
                        + problems * _HOST_BYTES_PER_PROBLEM) / GIB}


def host_available_gib() -> float | None:
    """Memory the host can still give (MemAvailable), GiB; None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(cfg, checkpoint_dir: str | Path, *, shards: int = 1, host_gib: float | None = None,
               device_gib: float | None = None) -> dict[str, float]:
    """Refuse, in one line with the estimate, a run whose memory cannot fit the device
    (``host_gib`` / ``device_gib``: what is there, measured when not given). Returns the estimate."""
    from quantroll.checkpoint.reader import CheckpointReader
    from quantroll.model.config import load_model_config

    with CheckpointReader(checkpoint_dir) as reader:
        params = sum(math.prod(info.shape) for info in reader.tensors.values())
    est = estimate_gib(cfg, params, load_model_config(checkpoint_dir).vocab_size, shards)
    flags = ("--rollout-batch-size, --n-samples-per-prompt, --rollout-max-response-len, --micro-batch-size, "
             "--train-problems, --eval-size or --kv-cache-memory-gb")
    check_need(est, cfg.models.device, flags, device_parts=("weights", "kv_pool", "logits"), host_gib=host_gib,
               device_gib=device_gib)
    return est


def check_need(est: dict[str, float], device: str, flags: str, *, device_parts: tuple[str, ...] = (),
               host_gib: float | None = None, device_gib: float | None = None) -> None:
    """Refuse, in one line with the estimate ``est`` (GiB by part) and the ``flags`` to
    lower, what cannot fit: on a CPU all of it in available memory; on a GPU the
    ``device_parts`` in the card's memory and the rest in the host's."""
    from quantroll.errors import QuantrollError

    dev = torch.device(device)
    if dev.type == "cuda":
        if device_gib is None and torch.cuda.is_available():
            device_gib = torch.cuda.get_device_properties(dev.index or 0).total_memory / GIB
        sides = [("the GPU", sum(v for k, v in est.items() if k in device_parts), device_gib),
                 ("host memory", sum(v for k, v in est.items() if k not in device_parts),
                  host_gib if host_gib is not None else host_available_gib())]
    else:
        sides = [("available memory", sum(est.values()), host_gib if host_gib is not None else host_available_gib())]
    for where, need, have in sides:
        if have is not None and need > have:
            parts = ", ".join(f"{k} {v:.3g}" for k, v in est.items() if v >= 0.001)
            raise QuantrollError(f"this run needs at least {need:.3g} GiB ({parts} GiB) but {where} holds "
                                 f"{have:.3g} GiB; lower {flags}")

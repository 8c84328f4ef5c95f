"""A BF16 engine copy of the trainer's policy, so that the trainer's weights are evaluated
through the engine (KV cache, batched) instead of a full forward per generated token.

The copy loads the trainer's BF16 checkpoint once; before each evaluation it takes the
policy's current weights (``export_state_dict``, the names of the checkpoint; a sharded
policy's parameters are gathered whole first) and generates with a BF16 KV cache, since
the trainer never attends over a quantized cache. In mode 1 it is the BF16 policy the
trainer updates; in modes 2-4 it evaluates the same BF16 weights without the trainer's
quantized forward, i.e. what the BF16 weights learned. On a GPU its KV pool is released
after each evaluation so that the rollout engine and the trainer get the memory back.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from quantroll.engine import CacheConfig, Engine, SchedulerConfig
from quantroll.trainer.export import export_state_dict


def full_weights(policy: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The policy's checkpoint tensors, whole: FSDP2's DTensor shards are gathered
    (a collective: every rank that holds a shard must call this)."""
    return export_state_dict(_Whole(policy), dtype)


class _Whole(torch.nn.Module):
    """A view of ``policy`` whose parameters are whole tensors (DTensors gathered), named as
    the policy's, so export_state_dict's rules (tied weights, inference-only buffers) apply."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "_policy", policy)
        self.config = getattr(policy, "config", None)

    def named_modules(self, *args, **kwargs):
        return self._policy.named_modules(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        for name, p in self._policy.named_parameters(*args, **kwargs):
            yield name, (p.full_tensor() if hasattr(p, "full_tensor") else p)

    def named_buffers(self, *args, **kwargs):
        for name, b in self._policy.named_buffers(*args, **kwargs):
            yield name, (b.full_tensor() if hasattr(b, "full_tensor") else b)


class PolicyEngine:
    """``engine_for(policy)``: the copy with the policy's weights loaded."""

    def __init__(self, checkpoint_dir: str | Path, device: str | torch.device, dtype: torch.dtype,
                 cache: CacheConfig | None = None, scheduler: SchedulerConfig | None = None):
        """``cache`` / ``scheduler``: the rollout engine's settings, so that the copy pools and
        batches as it does; its KV cache is BF16 whatever ``cache`` says (the trainer's policy)."""
        self.engine = Engine(checkpoint_dir, device=device, dtype=dtype,
                             cache=replace(cache or CacheConfig(), kv_cache_dtype="bf16"), scheduler=scheduler)

    @torch.no_grad()
    def engine_for(self, policy: torch.nn.Module) -> Engine:
        self.engine.load_weights(full_weights(policy, self.engine.dtype))
        if self.engine.device.type == "cuda":  # the trainer's cached blocks back to the driver, so that the KV
            torch.cuda.empty_cache()           # pool (a fraction of the free memory) is sized on what is free
        return self.engine

    def release(self) -> None:
        if self.engine.device.type == "cuda":
            self.engine.release_kv_cache()

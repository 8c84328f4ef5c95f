"""Arrival counters of the kernels in which the program that finishes last does a step for
the others (the decode GEMM's split-K sums): int32 arrays per (kind, device), zero between
launches because the kernels reset what they use.

One set per kind and device: the kernels of one device run one at a time (one stream, as
the engine's decode step and its CUDA graph do); two launches of one kind running
concurrently on two streams would share counters and must not be issued. Devices are keyed
with their index ("cuda" and "cuda:0" are one device)."""

from __future__ import annotations

import torch

_COUNTERS: dict[tuple[str, torch.device], torch.Tensor] = {}


def device_key(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def counters(kind: str, device, size: int) -> torch.Tensor:
    """The ``kind`` counters of ``device`` (made zero on first use; at least ``size``)."""
    key = (kind, device_key(device))
    if key not in _COUNTERS or _COUNTERS[key].numel() < size:
        _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=key[1])
    return _COUNTERS[key]


def existing(kind: str, device) -> torch.Tensor | None:
    """The ``kind`` counters of ``device`` if a launch made them, else None (no allocation:
    for checks after the fact)."""
    return _COUNTERS.get((kind, device_key(device)))

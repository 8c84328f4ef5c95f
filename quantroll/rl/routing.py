"""Routing replay (R3): the engine's expert choices laid out for the trainer's batch.

The engine returns, per sample, expert ids [P + R - 1, moe_layers, top_k]: one row per
position the trainer processes (prompt + response[:-1]). The trainer runs the batch
right-padded to [B, L] and routes tokens in flattened row-major order, so the replay
table of each MoE layer is [B * L, top_k]; padded positions get experts 0..k-1 (their
outputs are never used).
"""

from __future__ import annotations

import torch

from quantroll.model.moe import ReplayRouting


def replay_from_engine(routed: list[torch.Tensor], prompts: list[list[int]], responses: list[list[int]],
                       moe_layers: tuple[int, ...], top_k: int) -> ReplayRouting:
    b = len(prompts)
    length = max(len(p) + len(r) - 1 for p, r in zip(prompts, responses))
    table = torch.arange(top_k).expand(b, length, len(moe_layers), top_k).clone()
    for i, experts in enumerate(routed):
        table[i, : experts.shape[0]] = experts.long()
    return ReplayRouting({layer: table[:, :, j].reshape(b * length, top_k) for j, layer in enumerate(moe_layers)})

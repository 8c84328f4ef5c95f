"""Greedy decoding by full forward passes of a model (no cache): the independent reference
the engine's decoding is checked against (it was the RL loop's trainer evaluation before
held-out evaluation moved to an engine copy, quantroll/evaluation/policy_engine.py)."""

from __future__ import annotations

import torch


@torch.no_grad()
def greedy_full_forward(model, prompts: list[list[int]], max_new: int, stop: set[int]) -> list[list[int]]:
    """Prompts of equal length decode together, one forward per new token for the group;
    a row's tokens after its stop token are dropped."""
    device = next(model.parameters()).device
    stop_ids = torch.tensor(sorted(stop), device=device, dtype=torch.long)
    out: list[list[int] | None] = [None] * len(prompts)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    for rows in by_length.values():
        seqs = torch.tensor([prompts[i] for i in rows], device=device)
        done = torch.zeros(len(rows), dtype=torch.bool, device=device)
        for _ in range(max_new):
            token = model(seqs)[:, -1].argmax(-1)
            seqs = torch.cat([seqs, token[:, None]], 1)
            done |= torch.isin(token, stop_ids)
            if bool(done.all()):
                break
        for j, i in enumerate(rows):
            new = seqs[j, len(prompts[i]):].tolist()
            cut = next((k + 1 for k, t in enumerate(new) if t in stop), len(new))
            out[i] = new[:cut]
    return out

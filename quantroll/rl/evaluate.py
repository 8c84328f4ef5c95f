"""Held-out greedy accuracy of both policies: the engine's (rollout precision) and the
trainer's (BF16). Training reward measures only the quantized policy; this shows
whether what the BF16 weights learned survives quantization, and vice versa.
"""

from __future__ import annotations

import torch

from quantroll.engine import Engine, SamplingParams
from quantroll.tasks.base import Problem


@torch.no_grad()
def greedy_trainer(model, prompts: list[list[int]], max_new: int, stop: set[int]) -> list[list[int]]:
    """Greedy decoding with full forward passes (no cache: the trainer's own model, untouched).

    Prompts of equal length decode together, one forward per new token for the group;
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


def evaluate(engine: Engine, policy, tokenizer, task, problems: list[Problem], max_new: int) -> dict[str, float]:
    prompts = [tokenizer.encode(p.prompt, add_special_tokens=False).ids for p in problems]
    engine_out = [r.tokens for r in engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=max_new))]
    trainer_out = greedy_trainer(policy, prompts, max_new, set(engine.default_stop_ids))

    def accuracy(outputs):
        scores = [task.reward(tokenizer.decode(o, skip_special_tokens=False), p.label) for o, p in zip(outputs, problems)]
        return sum(s >= 1.0 for s in scores) / len(scores)

    return {"eval_engine_accuracy": accuracy(engine_out), "eval_trainer_accuracy": accuracy(trainer_out)}

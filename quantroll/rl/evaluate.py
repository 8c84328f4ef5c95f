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
    """Greedy decoding with full forward passes (no cache: the trainer's own model, untouched)."""
    out = []
    for prompt in prompts:
        seq, new = list(prompt), []
        device = next(model.parameters()).device
        for _ in range(max_new):
            token = int(model(torch.tensor([seq], device=device))[0, -1].argmax())
            new.append(token)
            seq.append(token)
            if token in stop:
                break
        out.append(new)
    return out


def evaluate(engine: Engine, policy, tokenizer, task, problems: list[Problem], max_new: int) -> dict[str, float]:
    prompts = [tokenizer.encode(p.prompt, add_special_tokens=False).ids for p in problems]
    engine_out = [r.tokens for r in engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=max_new))]
    trainer_out = greedy_trainer(policy, prompts, max_new, set(engine.default_stop_ids))

    def accuracy(outputs):
        scores = [task.reward(tokenizer.decode(o, skip_special_tokens=False), p.label) for o, p in zip(outputs, problems)]
        return sum(s >= 1.0 for s in scores) / len(scores)

    return {"eval_engine_accuracy": accuracy(engine_out), "eval_trainer_accuracy": accuracy(trainer_out)}

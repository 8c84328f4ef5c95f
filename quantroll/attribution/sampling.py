"""The responses attribution scores: prompts of a task, sampled by the engine.

Seed s draws its prompts with ``random.Random(s)`` and samples with engine seed s, so a
seed names one batch on every run and every machine (the engine's sampling noise is
counter-based: engine/sampling.py).
"""

from __future__ import annotations

import random

import torch

from quantroll.attribution.measure import Batch
from quantroll.engine import Engine, SamplingParams


def draw_batch(engine: Engine, tokenizer, task, seed: int, prompts: int, samples: int, max_new_tokens: int,
               temperature: float) -> Batch:
    rng = random.Random(seed)
    ids = []
    for _ in range(prompts):
        problem = task.sample(rng)
        ids += [tokenizer.encode(problem.prompt, add_special_tokens=False).ids] * samples
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    results = engine.generate(ids, params)
    width = max(len(r.logprobs) for r in results)
    logp = torch.zeros(len(results), width)
    for i, r in enumerate(results):
        logp[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
    return Batch(seed, ids, [r.tokens for r in results], logp)

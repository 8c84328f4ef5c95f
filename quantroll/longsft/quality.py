"""What the stop rule reads: per-token NLL and the sampled pass rate, per length bucket.

Teacher-forced argmax accuracy says little about a sampled 16K-token trace: a per-token
NLL of 4e-5 already gives a sampled trace of 16K tokens a pass rate of only
exp(-16K x 4e-5) ~ 0.52. So the check samples, as RL's rollout will: the model's current
weights through a BF16 engine copy (KV cache, batched; evaluation/policy_engine.py) at the
rollout temperature, each problem scored by the task's exact checker, and the pass rate
(the share scored 1) is reported per reference-length bucket with the teacher-forced
per-token NLL of the same problems beside it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from quantroll.engine import SamplingParams
from quantroll.evaluation.heldout import score, summarize
from quantroll.longsft.batches import micro_batches
from quantroll.metrics.by_length import length_bucket
from quantroll.sft import IGNORE, build_batch, sft_example
from quantroll.tasks.base import Problem
from quantroll.tasks.tokenizer import decode, encode


@torch.no_grad()
def nll_by_length(model: torch.nn.Module, problems: list[Problem], micro_tokens: int) -> dict:
    """``{"nll": per-token NLL over every target token, "by_len": {bucket: {"tokens", "nll"}}}``,
    teacher-forced on ``prompt + answer + EOS`` in length-bucketed micro-batches."""
    device = next(model.parameters()).device
    sums: dict[int, list[float]] = {}
    for batch in micro_batches([sft_example(p) for p in problems], micro_tokens):
        ids, labels = build_batch(batch)
        logits = model(ids.to(device)).float()
        labels = labels.to(device)
        per_token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")
        for row, (_, target) in enumerate(batch):
            total = sums.setdefault(length_bucket(len(target)), [0.0, 0])
            total[0] += float(per_token[row].sum())
            total[1] += int((labels[row] != IGNORE).sum())
    tokens = sum(t for _, t in sums.values())
    return {"nll": sum(s for s, _ in sums.values()) / tokens,
            "by_len": {str(b): {"tokens": sums[b][1], "nll": sums[b][0] / sums[b][1]} for b in sorted(sums)}}


def sampled_quality(engine, task, problems: list[Problem], temperature: float, seed: int) -> dict:
    """The engine's sampled answers (one per problem, at ``temperature``) scored exactly:
    ``{"pass_rate", "reward", "response_tokens", "by_len": {bucket: {"n", "pass_rate", "reward"}}}``."""
    longest = max(len(encode(p.label)) for p in problems) + 1
    params = SamplingParams(temperature=temperature, max_new_tokens=fit_new_tokens(engine, problems, longest + 8),
                            seed=seed)
    s = summarize(score(engine, task, problems, encode, decode, params))
    return {"pass_rate": s["accuracy"], "reward": s["reward"], "response_tokens": s["response_tokens"],
            "by_len": {b: {"n": v["n"], "pass_rate": v["accuracy"], "reward": v["reward"]}
                       for b, v in s["by_len"].items()}}


def fit_new_tokens(engine, problems: list[Problem], wanted: int) -> int:
    """``wanted`` new tokens, or fewer where the longest prompt would pass the model's context."""
    return min(wanted, engine.config.max_position_embeddings - max(len(encode(p.prompt)) for p in problems))


def expected_pass_rate(nll: float, tokens: int) -> float:
    """exp(-tokens x per-token NLL): the pass rate a per-token NLL allows at a length when
    every token must be right (an estimate beside the measured rate)."""
    return math.exp(-tokens * nll)

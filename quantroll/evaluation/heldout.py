"""Score held-out problems through an engine, overall and by length bucket.

Decoding through the engine (paged KV cache, continuous batching) costs O(L) per token;
a full forward per new token, as the trainer's own model would need, costs O(L^2) and
takes hours at 16K tokens. Both the engine's policy and the trainer's (through a BF16
engine copy of its weights, policy_engine.py) are evaluated this way.

The length bucket of a problem is that of its reference answer (the label's tokens plus
EOS), in powers of two as metrics/by_length.py buckets responses: ``b`` holds the
problems with ``b <= length < 2b``. Bucketing by the reference, not by what was
generated, keeps a wrong answer that stopped early in its problem's bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quantroll.engine import SamplingParams
from quantroll.metrics.by_length import length_bucket
from quantroll.tasks.base import Problem


@dataclass(frozen=True)
class Scored:
    """One problem's outcome: its reward, the tokens generated, and its reference length."""
    reward: float
    tokens: list[int]
    reference_tokens: int

    @property
    def right(self) -> bool:
        return self.reward >= 1.0


def score(engine, task, problems: Sequence[Problem], encode: Callable[[str], list[int]],
          decode: Callable[[list[int]], str], params: SamplingParams, batch_size: int = 256) -> list[Scored]:
    """Generate an answer to every problem with ``params`` (greedy at temperature 0) and
    score it with ``task.reward``; ``batch_size`` prompts go to the engine at a time."""
    out = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i: i + batch_size]
        results = engine.generate([encode(p.prompt) for p in chunk], params)
        for r, p in zip(results, chunk):
            out.append(Scored(float(task.reward(decode(r.tokens), p.label)), list(r.tokens), len(encode(p.label)) + 1))
    return out


def summarize(scored: Sequence[Scored]) -> dict:
    """``{"reward", "accuracy", "response_tokens", "by_len": {bucket: {"n", "reward", "accuracy"}}}``:
    means over problems (accuracy: the share with reward 1), overall and per bucket."""
    def stats(items: Sequence[Scored]) -> dict:
        n = len(items)
        return {"n": n, "reward": sum(s.reward for s in items) / n, "accuracy": sum(s.right for s in items) / n}

    buckets: dict[int, list[Scored]] = {}
    for s in scored:
        buckets.setdefault(length_bucket(s.reference_tokens), []).append(s)
    overall = stats(scored)
    return {"reward": overall["reward"], "accuracy": overall["accuracy"],
            "response_tokens": sum(len(s.tokens) for s in scored) / len(scored),
            "by_len": {str(b): stats(buckets[b]) for b in sorted(buckets)}}


def greedy(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)

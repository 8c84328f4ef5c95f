"""Held-out greedy accuracy of both policies: the engine's (rollout precision) and the
trainer's (BF16). Training reward measures only the quantized policy; this shows
whether what the BF16 weights learned survives quantization, and vice versa.

Both decode through an engine (paged KV cache, batched), so a 16K-token answer costs
O(L) per token rather than a full forward per token: the trainer's policy through a BF16
engine copy whose weights are the trainer's (evaluation/policy_engine.py), loaded before
each evaluation. Reward and accuracy are reported overall and per bucket of the reference
answer's length (``eval_engine_by_len`` / ``eval_trainer_by_len``: bucket ->
``{"n", "reward", "accuracy"}``, evaluation/heldout.py).
"""

from __future__ import annotations

from quantroll.evaluation.heldout import greedy, score, summarize
from quantroll.evaluation.policy_engine import PolicyEngine
from quantroll.tasks.base import Problem


def evaluate(engine, trainer_copy: PolicyEngine, policy, tokenizer, task, problems: list[Problem],
             max_new: int) -> dict:
    """Greedy answers of ``engine`` and of ``policy`` (through ``trainer_copy``) to ``problems``,
    scored by ``task.reward``: accuracy (the share with reward 1), mean reward, by length."""
    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    out = {}
    sides = (("engine", lambda: engine), ("trainer", lambda: trainer_copy.engine_for(policy)))
    for side, get in sides:
        s = summarize(score(get(), task, problems, encode, decode, greedy(max_new)))
        out.update({f"eval_{side}_accuracy": s["accuracy"], f"eval_{side}_reward": s["reward"],
                    f"eval_{side}_by_len": s["by_len"]})
    trainer_copy.release()
    return out

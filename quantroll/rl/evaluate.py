"""Held-out greedy accuracy of both policies: the engine's (rollout precision) and the
trainer's (BF16). Training reward measures only the quantized policy; this shows
whether what the BF16 weights learned survives quantization, and vice versa.

Both decode through an engine (paged KV cache, batched), so a 16K-token answer costs
O(L) per token rather than a full forward per token: the trainer's policy through a BF16
engine copy whose weights are the trainer's (evaluation/policy_engine.py), loaded before
each evaluation. Where the engine already is the trainer's policy (BF16 weights, pushed
exactly, a BF16 KV cache, the trainer's kernels: ``engine_is_trainer_policy``), the copy would
decode every held-out answer a second time, so there is none and the trainer's
numbers are the engine's. Reward and accuracy are reported overall and per bucket of the reference
answer's length (``eval_engine_by_len`` / ``eval_trainer_by_len``: bucket ->
``{"n", "reward", "accuracy"}``, evaluation/heldout.py).
"""

from __future__ import annotations

from quantroll.evaluation.heldout import greedy, score, summarize
from quantroll.evaluation.policy_engine import PolicyEngine
from quantroll.tasks.base import Problem


def engine_is_trainer_policy(engine_format, kv_cache_dtype: str, true_on_policy: bool) -> bool:
    """Whether the rollout engine computes exactly what the trainer's policy would through a
    BF16 engine copy: BF16 weights (no quantized format; the weight update copies them
    exactly), a BF16 KV cache, and the default kernels (true on-policy runs the engine on
    batch-invariant ones, which the copy does not use)."""
    return engine_format is None and kv_cache_dtype == "bf16" and not true_on_policy


def evaluate(engine, trainer_copy: PolicyEngine | None, policy, tokenizer, task, problems: list[Problem],
             max_new: int) -> dict:
    """Greedy answers of ``engine`` and of ``policy`` (through ``trainer_copy``) to ``problems``,
    scored by ``task.reward``: accuracy (the share with reward 1), mean reward, by length.
    ``trainer_copy`` None: the engine is the trainer's policy (``engine_is_trainer_policy``),
    whose numbers the trainer's side then repeats."""
    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    def scored(on) -> dict:
        return summarize(score(on, task, problems, encode, decode, greedy(max_new)))

    sides = {"engine": scored(engine)}
    if trainer_copy is None:
        sides["trainer"] = sides["engine"]
    else:
        sides["trainer"] = scored(trainer_copy.engine_for(policy))
        trainer_copy.release()
    return {f"eval_{side}_{key}": s[key] for side, s in sides.items() for key in ("accuracy", "reward", "by_len")}

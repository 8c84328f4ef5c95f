"""Rollout: sample prompts from a task, generate with the engine, score the answers."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import torch

from quantroll.engine import Engine, GenerationResult, SamplingParams
from quantroll.errors import QuantrollError
from quantroll.rl.config import RolloutConfig
from quantroll.tasks.arithmetic import ArithmeticTask, CountTask
from quantroll.tasks.trace import FibTraceTask

BUILTIN_TASKS = ("arithmetic", "count", "fib")


def make_task(name: str, digits: int = 2, span: int = 16, prompt_data: str | None = None, input_key: str = "prompt",
              label_key: str = "label", custom_rm_path: str | None = None, trace_len: int = 1024, trace_terms: int = 2,
              trace_partial_credit: bool = False):
    """A built-in task, or the user's data with their reward function (exact match by default)."""
    from quantroll.tasks.data import DataTask, load_reward, read_problems

    if prompt_data:
        return DataTask(read_problems(prompt_data, input_key, label_key),
                        load_reward(custom_rm_path) if custom_rm_path else None,
                        reward_name=f"--custom-rm-path {custom_rm_path}" if custom_rm_path else "exact match")
    if name == "arithmetic":
        return ArithmeticTask(digits=digits)
    if name == "count":
        return CountTask(span=span)
    if name == "fib":
        return FibTraceTask(length=trace_len, terms=trace_terms, partial_credit=trace_partial_credit)
    raise QuantrollError(f"unknown task '{name}'; built-in tasks: {', '.join(BUILTIN_TASKS)}")


def build_task(cfg: RolloutConfig) -> tuple[object, list | None]:
    """(training task, held-out evaluation problems or None) for a run's rollout settings.

    A built-in task trains on a pool of ``cfg.train_problems`` problems (0: a fresh
    problem every time, never a held-out one) and, when evaluation is on without --eval-data, is evaluated on
    ``cfg.eval_size`` held-out problems: the same held-out stream ``quantroll sft`` keeps
    out of training, never in the pool."""
    from quantroll.tasks.base import FreshTask, PoolTask
    from quantroll.tasks.data import read_problems
    from quantroll.sft import DEFAULT_EVAL_SIZE, held_out_problems

    task = make_task(cfg.task, cfg.digits, cfg.count_span, cfg.prompt_data, cfg.input_key, cfg.label_key,
                     cfg.custom_rm_path, cfg.trace_len, cfg.trace_terms, cfg.trace_partial_credit)
    longest = getattr(task, "max_response_tokens", None)
    if longest is not None and cfg.rollout_max_response_len < longest:
        raise QuantrollError(f"--rollout-max-response-len {cfg.rollout_max_response_len} cuts the {task.name} task's "
                             f"longest right answers ({longest} tokens with EOS at --trace-len {cfg.trace_len}), which "
                             f"would all score 0; raise it to at least {longest}")
    evaluation = read_problems(cfg.eval_data, cfg.input_key, cfg.label_key, "--eval-data") if cfg.eval_data else None
    if cfg.prompt_data:
        return task, evaluation
    # one draw of the held-out stream: its head is the evaluation set, all of it stays out of the pool
    held_out = held_out_problems(task, max(cfg.eval_size, DEFAULT_EVAL_SIZE), seed=0)
    if evaluation is None and cfg.eval_interval:
        evaluation = held_out[: cfg.eval_size]
    exclude = frozenset(p.prompt for p in held_out)
    if not cfg.train_problems:
        return FreshTask(task, exclude), evaluation
    try:
        pool = PoolTask.draw(task, cfg.train_problems, cfg.seed, exclude)
    except ValueError as err:
        raise QuantrollError(f"--train-problems {cfg.train_problems}: {err}; lower it") from None
    return pool, evaluation


@dataclass
class RolloutBatch:
    prompts: list[list[int]]
    labels: list[str]
    results: list[GenerationResult]
    rewards: torch.Tensor  # [B] float32
    seconds: float
    engine_stats: dict = field(default_factory=dict)  # the engine's counters for this rollout (rollout_* metrics)

    @property
    def responses(self) -> list[list[int]]:
        return [r.tokens for r in self.results]

    def rollout_logprobs(self) -> torch.Tensor:
        """[B, R] padded with zeros, like the trainer's logprobs."""
        width = max(len(r.logprobs) for r in self.results)
        out = torch.zeros(len(self.results), width)
        for i, r in enumerate(self.results):
            out[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
        return out

    @property
    def num_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.results)


def rollout(engine: Engine, tokenizer, task, rng: random.Random, prompts_per_step: int, samples_per_prompt: int,
            params: SamplingParams) -> RolloutBatch:
    problems = [task.sample(rng) for _ in range(prompts_per_step)]
    prompts, labels = [], []
    for p in problems:  # the samples of one prompt are consecutive (GRPO groups)
        ids = tokenizer.encode(p.prompt, add_special_tokens=False).ids
        prompts += [ids] * samples_per_prompt
        labels += [p.label] * samples_per_prompt
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    rewards = []
    name = getattr(task, "reward_name", f"the {getattr(task, 'name', 'task')} reward")
    for i, (res, label) in enumerate(zip(results, labels)):
        text = tokenizer.decode(res.tokens, skip_special_tokens=False)
        try:
            value = float(task.reward(text, label))
        except Exception as err:  # a user's reward function: stop with the sample that broke it
            raise QuantrollError(f"the reward function ({name}) raised on sample {i} ({text!r}): "
                                 f"{type(err).__name__}: {err}") from None
        if not math.isfinite(value):  # it would poison the whole group's advantages
            raise QuantrollError(f"the reward function ({name}) returned {value} for sample {i} ({text!r}); rewards "
                                 "must be finite numbers: fix the function")
        rewards.append(value)
    stats = engine.last_stats
    counters = {f"rollout_{k}": float(stats[k]) for k in ("preemptions", "prefill_tokens", "prefill_tokens_saved",
                                                          "peak_blocks_used") if k in stats}
    if "num_blocks" in stats and "block_size" in stats:  # the pool this rollout ran in, on whichever rank held it
        counters["kv_cache_capacity_tokens"] = float(stats["num_blocks"] * stats["block_size"])
    return RolloutBatch(prompts, labels, results, torch.tensor(rewards, dtype=torch.float32), seconds, counters)


def rewards_by_length(batch: RolloutBatch, tokenizer) -> dict[str, dict]:
    """The rollout's reward and accuracy per bucket of the reference answer's length (the
    label's tokens + EOS; evaluation/heldout.py): ``{bucket: {"n", "reward", "accuracy"}}``."""
    from quantroll.evaluation.heldout import Scored, summarize

    lengths = {label: len(tokenizer.encode(label, add_special_tokens=False).ids) + 1 for label in set(batch.labels)}
    scored = [Scored(float(r), res.tokens, lengths[label])
              for r, res, label in zip(batch.rewards.tolist(), batch.results, batch.labels)]
    return summarize(scored)["by_len"]

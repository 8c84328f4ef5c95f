"""Token-sized steps, split into length-bucketed micro-batches.

A step holds about ``tokens_per_batch`` tokens of examples (prompt + answer + EOS), so a
step at 16K-token traces sees as many tokens as one at 1K, and the step's examples are
drawn from a stream seeded by (seed, step) alone: a resumed run draws exactly what an
uninterrupted one would, with no generator state to save. The step is cut into
micro-batches of at most ``micro_tokens`` positions each, padding included, after sorting
by length, so sequences of similar length share a forward and none is padded to the
longest of the step. Gradients of the micro-batches accumulate (FP32 sums) into one
optimizer step whose loss is the token mean over every target token of the step, the
same value one forward over the whole step would give.
"""

from __future__ import annotations

import random

from quantroll.errors import QuantrollError
from quantroll.sft import sft_example
from quantroll.tasks.base import Task

Example = tuple[list[int], list[int]]  # (prompt ids, target ids = answer + EOS)


def step_examples(task: Task, seed: int, step: int, tokens_per_batch: int, exclude: set[str] | frozenset[str],
                  tries: int = 100_000) -> list[Example]:
    """Examples of step ``step``: drawn until the next would pass ``tokens_per_batch``
    tokens (at least one), none with a prompt in ``exclude`` (the held-out sets)."""
    rng = random.Random(f"quantroll-longsft-{seed}-{step}")
    out: list[Example] = []
    total = 0
    for _ in range(tries):
        problem = task.sample(rng)
        if problem.prompt in exclude:
            continue
        example = sft_example(problem)
        n = len(example[0]) + len(example[1])
        if not out and n > tokens_per_batch:
            raise QuantrollError(f"--tokens-per-batch {tokens_per_batch} is smaller than one example "
                                 f"({n} tokens); raise it")
        if total + n > tokens_per_batch:
            return out
        out.append(example)
        total += n
    raise QuantrollError("the held-out sets cover (nearly) every problem of the task; lower --eval-size/--val-size")


def micro_batches(examples: list[Example], micro_tokens: int) -> list[list[Example]]:
    """``examples`` longest first, in consecutive groups whose rows x longest input length
    (what the padded forward computes) stays within ``micro_tokens``."""
    ordered = sorted(examples, key=lambda e: len(e[0]) + len(e[1]), reverse=True)
    out: list[list[Example]] = []
    for example in ordered:
        length = len(example[0]) + len(example[1]) - 1  # inputs: every token but the last
        if length > micro_tokens:
            raise QuantrollError(f"--micro-batch-tokens {micro_tokens} is smaller than one example ({length} "
                                 "positions); raise it")
        if out and (len(out[-1]) + 1) * (len(out[-1][0][0]) + len(out[-1][0][1]) - 1) <= micro_tokens:
            out[-1].append(example)  # the group's first is its longest
        else:
            out.append([example])
    return out

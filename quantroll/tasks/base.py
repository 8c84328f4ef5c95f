"""What a verifiable task is: problems with a label, and a reward that checks an answer."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from quantroll.errors import QuantrollError


@dataclass(frozen=True)
class Problem:
    prompt: str
    label: str
    where: str | None = field(default=None, compare=False)  # "file:line" of a problem read from the user's data


class Task(Protocol):
    name: str

    def sample(self, rng: random.Random) -> Problem: ...

    def reward(self, response: str, label: str) -> float: ...


def answer_text(response: str, stop: str = "<|endoftext|>") -> str:
    """The response up to its end-of-text marker (or all of it), without outer spaces."""
    return response.split(stop, 1)[0].strip()


def distinct_problems(task: Task, rng: random.Random, n: int, exclude: frozenset[str] = frozenset(),
                      tries_per_problem: int = 1000) -> list[Problem]:
    """Up to ``n`` problems with distinct prompts, none in ``exclude``, in draw order
    (fewer only when the task runs out of new prompts)."""
    out: dict[str, Problem] = {}
    for _ in range(tries_per_problem * n):
        if len(out) == n:
            break
        p = task.sample(rng)
        if p.prompt not in exclude:
            out.setdefault(p.prompt, p)
    return list(out.values())


@dataclass(frozen=True)
class PoolTask:
    """A built-in task restricted to a fixed training set of problems.

    RL runs train on a finite prompt set, visited over and over (epochs); that is also
    what lets a tiny model's reward rise within minutes, where fresh problems at every
    step would only show slow generalization. The pool is drawn once from ``base``
    (seeded), never containing a prompt of ``exclude`` (the held-out evaluation set)."""

    base: Task
    problems: tuple[Problem, ...]
    name: str = "pool"

    @classmethod
    def draw(cls, base: Task, size: int, seed: int, exclude: frozenset[str] = frozenset()) -> "PoolTask":
        pool = distinct_problems(base, random.Random(f"quantroll-train-pool-{seed}"), size, exclude)
        if len(pool) < size:
            raise ValueError(f"the task has fewer than {size} distinct problems outside the held-out set")
        return cls(base, tuple(pool), f"{base.name} ({size} training problems)")

    def sample(self, rng: random.Random) -> Problem:
        return rng.choice(self.problems)

    def reward(self, response: str, label: str) -> float:
        return self.base.reward(response, label)


@dataclass(frozen=True)
class FreshTask:
    """A built-in task drawing a new problem every time (``--train-problems 0``), but never
    one of ``exclude`` (the held-out evaluation set): training on an evaluation problem
    would make held-out accuracy measure memory instead of skill."""

    base: Task
    exclude: frozenset[str]

    @property
    def name(self) -> str:
        return self.base.name

    def sample(self, rng: random.Random) -> Problem:
        return training_problems(self.base, rng, 1, self.exclude)[0]

    def reward(self, response: str, label: str) -> float:
        return self.base.reward(response, label)


def held_out_problems(task: Task, n: int, seed: int) -> list[Problem]:
    """``n`` distinct evaluation problems, from a stream separate from training's."""
    return distinct_problems(task, random.Random(f"quantroll-sft-eval-{seed}"), n, tries_per_problem=100)


def training_problems(task: Task, rng: random.Random, n: int, exclude: set[str]) -> list[Problem]:
    """``n`` problems whose prompts are not in ``exclude`` (the held-out set)."""
    out = []
    for _ in range(1000 * n):
        p = task.sample(rng)
        if p.prompt not in exclude:
            out.append(p)
            if len(out) == n:
                return out
    raise QuantrollError(f"the {getattr(task, 'name', 'task')} task's held-out set covers (nearly) every problem: "
                         "1000 draws per problem were held-out ones; lower --eval-size")

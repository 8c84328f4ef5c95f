"""What a verifiable task is: problems with a label, and a reward that checks an answer."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Problem:
    prompt: str
    label: str


class Task(Protocol):
    name: str

    def sample(self, rng: random.Random) -> Problem: ...

    def reward(self, response: str, label: str) -> float: ...


def answer_text(response: str, stop: str = "<|endoftext|>") -> str:
    """The response up to its end-of-text marker (or all of it), without outer spaces."""
    return response.split(stop, 1)[0].strip()

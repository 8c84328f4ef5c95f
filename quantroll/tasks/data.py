"""A user's prompts and reward: ``--prompt-data FILE.jsonl --input-key K --label-key K``
and ``--custom-rm-path module:function``.

The reward function is called as ``function(response: str, label: str) -> float``;
without one, the reward is exact match of the stripped answer with the label.
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from quantroll.errors import QuantrollError
from quantroll.tasks.base import Problem, answer_text


def load_reward(path: str) -> Callable[[str, str], float]:
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise QuantrollError(f"--custom-rm-path '{path}' must look like 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise QuantrollError(f"--custom-rm-path '{path}': cannot import it ({err})") from None
    if not callable(fn):
        raise QuantrollError(f"--custom-rm-path '{path}' is not callable")
    return fn


def read_problems(path: str | Path, input_key: str, label_key: str, flag: str = "--prompt-data") -> list[Problem]:
    """The rows of a JSONL file given by ``flag`` (named in every error)."""
    p = Path(path)
    if not p.is_file():
        raise QuantrollError(f"{flag} {p} not found")
    problems = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise QuantrollError(f"{p}:{i} is not valid JSON ({err.msg})") from None
        if input_key not in row or label_key not in row:
            raise QuantrollError(f"{p}:{i} lacks '{input_key}' or '{label_key}' (set --input-key / --label-key)")
        problems.append(Problem(str(row[input_key]), str(row[label_key])))
    if not problems:
        raise QuantrollError(f"{flag} {p} holds no rows")
    return problems


@dataclass
class DataTask:
    """Problems from a file, drawn at random; reward by the user's function or exact match."""

    problems: list[Problem]
    reward_fn: Callable[[str, str], float] | None = None
    name: str = field(default="data")

    def sample(self, rng: random.Random) -> Problem:
        return rng.choice(self.problems)

    def reward(self, response: str, label: str) -> float:
        if self.reward_fn is None:
            return 1.0 if answer_text(response) == label else 0.0
        return float(self.reward_fn(response, label))

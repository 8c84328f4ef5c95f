"""A user's prompts and reward: ``--prompt-data FILE.jsonl --input-key K --label-key K``
and ``--custom-rm-path module:function``.

The reward function is called as ``function(response: str, label: str) -> float``;
without one, the reward is exact match of the stripped answer with the label.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from quantroll.errors import QuantrollError
from quantroll.inputs import iter_jsonl, json_field, kind_of
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
    """The rows of a JSONL file given by ``flag`` (named in every error). Each row is an
    object whose prompt and label are strings: a null, a number or a list would be
    trained on as its Python text ("None") and rewarded against that, so it is refused
    with its line."""
    p = Path(path)
    problems = []
    for i, row in iter_jsonl(p, flag):
        where = f"{p}:{i}"
        if not isinstance(row, dict):
            raise QuantrollError(f"{where} is {kind_of(row)}, not an object like "
                                 f'{{"{input_key}": "...", "{label_key}": "..."}}')
        prompt = json_field(row, input_key, where, str, "--input-key")
        label = json_field(row, label_key, where, str, "--label-key")
        if not prompt.strip():
            raise QuantrollError(f"{where}: {input_key!r} is empty; every prompt needs some text")
        problems.append(Problem(prompt, label, where))
    if not problems:
        raise QuantrollError(f"{flag} {p} holds no rows")
    return problems


def check_vocabulary(problems: list[Problem], tokenizer, flag: str) -> None:
    """Every character of every prompt and label has a token: one the tokenizer lacks would
    silently become its unknown token (the character tokenizer's pad token), so the model
    would see a prompt nobody wrote, or be rewarded against a label it can never spell.
    One line naming the character and the file line."""
    from quantroll.tasks.tokenizer import first_unknown

    for problem in problems:
        for what, text in (("prompt", problem.prompt), ("label", problem.label)):
            bad = first_unknown(tokenizer, text)
            if bad is not None:
                code = " ".join(f"U+{ord(c):04X}" for c in bad[:4])
                raise QuantrollError(f"{problem.where or flag}: the {what} holds {bad!r} ({code}), which the "
                                     "checkpoint's tokenizer has no token for (it would silently become its unknown "
                                     "token); remove or replace that character")


def check_prompt_lengths(problems: list[Problem], tokenizer, context: int, max_new: int, flag: str) -> None:
    """Every prompt and label is spelled in the tokenizer's vocabulary (``check_vocabulary``),
    and every prompt, tokenized as the rollout will, leaves room for ``max_new`` tokens in
    the model's ``context``; otherwise one line naming the file and line."""
    check_vocabulary(problems, tokenizer, flag)
    for problem in problems:
        n = len(tokenizer.encode(problem.prompt, add_special_tokens=False).ids)
        if n == 0:
            raise QuantrollError(f"{problem.where or flag}: the prompt has no tokens; give it some text")
        if n + max_new > context:
            raise QuantrollError(f"{problem.where or flag}: the prompt is {n} tokens; with --rollout-max-response-len "
                                 f"{max_new} it needs {n + max_new} positions but the model's context is {context}; "
                                 "shorten it or lower --rollout-max-response-len")


def check_spelled(problems: list[Problem], tokenizer, source: str, task_name: str) -> None:
    """Every prompt and label of a built-in task comes back from the checkpoint's tokenizer as
    written: a character it lacks (the line break of ``fib`` in a tokenizer made before it)
    would be read as padding and every answer scored 0, so it is one line naming it."""
    for problem in problems:
        text = problem.prompt + problem.label
        back = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
        if back != text:
            i = next((k for k, (a, b) in enumerate(zip(text, back)) if a != b), min(len(text), len(back)))
            raise QuantrollError(f"the {task_name} task writes {text[i: i + 1]!r}, which the tokenizer of {source} "
                                 "does not spell; use a model whose tokenizer has it (e.g. one made by "
                                 f"`quantroll sft --task {task_name}`)")


@dataclass
class DataTask:
    """Problems from a file, drawn at random; reward by the user's function or exact match."""

    problems: list[Problem]
    reward_fn: Callable[[str, str], float] | None = None
    name: str = field(default="data")
    reward_name: str = "exact match"  # how errors name the reward function (its --custom-rm-path)

    def sample(self, rng: random.Random) -> Problem:
        return rng.choice(self.problems)

    def reward(self, response: str, label: str) -> float:
        if self.reward_fn is None:
            return 1.0 if answer_text(response) == label else 0.0
        return float(self.reward_fn(response, label))

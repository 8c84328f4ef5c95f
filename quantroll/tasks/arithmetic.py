"""Built-in verifiable tasks.

- ``arithmetic``: "a+b=" / "a-b=" / "a*b=" with operands of ``digits`` digits; the
  answer is the integer, exactly. Difficulty grows with digits and with "*".
- ``count``: "count 17 to 41:" answered "17 18 ... 41"; the answer length grows with
  the span (``span``), so response length can be swept while the task stays exact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from quantroll.errors import QuantrollError
from quantroll.tasks.base import Problem, answer_text

# Python refuses to write an integer of more than 4300 digits as text (sys.int_info), and a
# product of two d-digit operands has up to 2d digits; a prompt of 2 * 2000 + 2 tokens is
# also beyond any built-in model's context, which the context check then says.
MAX_DIGITS = 2000


@dataclass(frozen=True)
class ArithmeticTask:
    digits: int = 2
    ops: str = "+-"
    name: str = "arithmetic"

    def __post_init__(self):
        if not 1 <= self.digits <= MAX_DIGITS:
            raise QuantrollError(f"--digits must be in 1..{MAX_DIGITS} (digits per operand of the arithmetic task), "
                                 f"got {self.digits}")

    def sample(self, rng: random.Random) -> Problem:
        lo, hi = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits - 1
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(self.ops)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return Problem(f"{a}{op}{b}=", str(value))

    def reward(self, response: str, label: str) -> float:
        return 1.0 if answer_text(response) == label else 0.0


@dataclass(frozen=True)
class CountTask:
    """Count from a start to start + span - 1. 1,000 starts: the held-out set (256, the
    same stream sft keeps out) and a training pool must both fit (with 101 starts every
    problem was held out and `train --task count` was refused at its defaults)."""

    span: int = 16
    start_max: int = 999
    name: str = "count"

    def sample(self, rng: random.Random) -> Problem:
        start = rng.randint(0, self.start_max)
        end = start + self.span - 1
        return Problem(f"count {start} to {end}:", " ".join(str(i) for i in range(start, end + 1)))

    def reward(self, response: str, label: str) -> float:
        return 1.0 if answer_text(response) == label else 0.0

"""``fib`` at several lengths at once: what the study's model is fine-tuned on.

The long-response study (issue 42) runs RL at 4K, 8K and 16K-token traces with one model.
A fib problem's counter width follows from its length (3 digits at 4K and 8K, 4 at 16K:
trace.py), so a model fine-tuned at one length has never seen the other lengths' lines
and prompts. The mixture draws each problem's length knob uniformly from ``lengths`` and
then the problem from that length's FibTraceTask, so one SFT run covers every studied
length (and the stop rule's per-length pass rates are reported per bucket).

Checking needs no length: a response is compared line by line with its own label, the
same rule at every length, so ``check`` and ``reward`` are the first length's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from quantroll.errors import QuantrollError
from quantroll.tasks.base import Problem
from quantroll.tasks.trace import FibTraceTask, LineCheck


@dataclass(frozen=True)
class FibTraceMix:
    lengths: tuple[int, ...] = (4096, 8192, 16384)  # target trace lengths in tokens, drawn uniformly per problem
    terms: int = 2
    digits: int = 4
    spread: float = 0.2
    partial_credit: bool = False
    name: str = "fib"

    def __post_init__(self):
        if len(self.lengths) < 2:
            raise QuantrollError(f"a fib mixture needs at least two --trace-len values, got {list(self.lengths)}; "
                                 "give one value for a single length")
        if len(set(self.lengths)) != len(self.lengths):
            raise QuantrollError(f"--trace-len {','.join(map(str, self.lengths))}: a length is given twice")
        _ = self.tasks  # each length's own checks (terms, digits, a length shorter than a line)

    @property
    def tasks(self) -> tuple[FibTraceTask, ...]:
        return tuple(FibTraceTask(length=n, terms=self.terms, digits=self.digits, spread=self.spread,
                                  partial_credit=self.partial_credit) for n in self.lengths)

    @property
    def max_response_tokens(self) -> int:
        return max(t.max_response_tokens for t in self.tasks)

    def sample(self, rng: random.Random) -> Problem:
        return self.tasks[rng.randrange(len(self.lengths))].sample(rng)

    def check(self, response: str, label: str) -> LineCheck:
        return self.tasks[0].check(response, label)

    def reward(self, response: str, label: str) -> float:
        return self.tasks[0].reward(response, label)

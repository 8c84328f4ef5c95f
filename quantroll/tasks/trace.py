"""``fib``: a long scratchpad with an exact checker, whose length one knob sets.

The study of issue 42 needs responses of 1K-16K tokens that a small model, trained from
scratch, gets right often but not always, and a checker that says exactly whether a trace
is right. The trace is a k-term Fibonacci sequence modulo 10^d, one self-contained line per
term:

    prompt   "fib 2100:4123,8765\\n"           (counter of the first line, then the k start terms)
    line     "2100:4123+8765=2988\\n"          (counter, the k previous terms in any order, their sum)
    next     "1100:2988+8765=0754\\n"  ...   last line has counter 0, then EOS

Every number is written least-significant digit first and zero-padded to a fixed width,
so the carry runs in writing order (an earlier CPU measurement: lines ``x+y=z`` learned far
better than ``i:F_i``, which asks for the whole sum in one token's look-ahead). The counter
counts down to 0 in the same least-significant-first spelling, so knowing when to stop is a
local decrement, not a count over thousands of lines. Each line needs only the previous
lines' sums (and the counter above it): what it computes is local, so a model that learned
it at 1K tokens can write 16K, and its per-token error compounds with length (reward ~
exp(-tokens x per-token error)), which is the effect the study measures. Why not the other
candidates: running sums over a list in the prompt doubles the context (the list is as long
as the trace) and asks for a lookup at growing distance that a small model learns slowly;
Collatz in binary has a natural long tail but no knob that sets the length.

Learnability, as far as a 2-core CPU could show it (0.43M parameters: 2 layers, hidden 128;
digits 2, length 120; 2,048 tokens a step, lr 3e-3, seed 0): token-mean loss 4.94 at step 0,
1.24 at 100, 0.89 at 200, 0.50 at 275 and still falling steeply (the floor is the operand
order's ~ln 2 per line, ~0.06 a token here); the sampled pass rate was still 0 at step 250.
How many steps the study's model needs at 1K-16K is for the GPU run to measure (``sft
--tokens-per-batch``'s stop rule reads the sampled pass rate per length bucket).

Free choice: the k operands of a line may come in any order (the sum is the same), so a
sampling policy has log2(k!) bits of real choice per line (1 bit for k = 2), as long
reasoning traces have, instead of a deterministic trace with zero entropy. The reference
trace (the label, and the SFT target) draws the order at random.

Difficulty (the "harder tasks fail sooner" axis): ``terms`` 2 (Fibonacci) or 3
(Tribonacci: three operands to find and add, carries up to 2). ``digits`` sets the modulus.

Length: with w counter digits, a line is ``w + (terms + 1) * (digits + 1) + 1`` tokens, and a
trace of n lines is ``n * that + 1`` tokens (EOS). The knob ``length`` is the target trace
length in tokens; n is drawn uniformly in ``[(1 - spread) n0, (1 + spread) n0]`` with
``n0 = round((length - 1) / line_tokens)``, so a run has a spread of lengths to report by
length bucket. w is the width of the largest counter, the same for every problem of a task.
E.g. terms 2, digits 4, length 4096: w 3, 19 tokens a line, n in [172, 259], 3269-4922 tokens.

Reward: 1 when the response, up to its EOS, is exactly n correct lines followed by EOS (a
line is correct when its counter and sum equal the reference's and its operands are the
reference's in some order), else 0. With ``partial_credit``, a response that is not
fully right scores the fraction of its leading correct lines (below 1): each line is
computed from the lines before it, so the first wrong line is where the computation
failed and the prefix before it is what was computed right; the score then rises smoothly
with per-token accuracy where the exact reward is ~0 at long lengths. Accuracy (reward 1)
is exact either way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from quantroll.errors import QuantrollError
from quantroll.tasks.base import Problem
from quantroll.tasks.tokenizer import EOS, LINE


def lsd(value: int, width: int) -> str:
    """``value`` zero-padded to ``width`` digits, least significant digit first."""
    return str(value).zfill(width)[::-1]


@dataclass(frozen=True)
class LineCheck:
    """What the checker found: leading correct lines, the reference's line count, and
    whether the whole response is exactly right (all lines, nothing more, then EOS)."""
    correct_lines: int
    lines: int
    exact: bool


@dataclass(frozen=True)
class FibTraceTask:
    length: int = 1024  # target trace length in tokens (the knob)
    terms: int = 2  # operands per line: 2 Fibonacci, 3 Tribonacci (harder)
    digits: int = 4  # terms modulo 10^digits
    spread: float = 0.2  # lines drawn in [(1 - spread) n0, (1 + spread) n0]
    partial_credit: bool = False
    name: str = "fib"

    def __post_init__(self):
        if self.terms not in (2, 3):
            raise QuantrollError(f"--trace-terms must be 2 (Fibonacci) or 3 (Tribonacci), got {self.terms}")
        if not 1 <= self.digits <= 9:
            raise QuantrollError(f"fib digits must be in 1..9, got {self.digits}")
        if not 0 <= self.spread < 1:
            raise QuantrollError(f"fib spread must be in [0, 1), got {self.spread}")
        if self.length < self.line_tokens_at(1) + 1:
            raise QuantrollError(f"--trace-len {self.length} is shorter than one line of the fib task "
                                 f"({self.line_tokens_at(1) + 1} tokens with EOS); give a longer one")

    def line_tokens_at(self, width: int) -> int:
        return width + (self.terms + 1) * (self.digits + 1) + 1

    @property
    def line_range(self) -> tuple[int, int, int]:
        """(fewest lines, most lines, counter width) of this task's problems."""
        for width in range(1, 12):  # the narrowest counter that holds the largest count (it sets the line count)
            n0 = max(1, round((self.length - 1) / self.line_tokens_at(width)))
            lo, hi = max(1, int(n0 * (1 - self.spread))), max(1, int(n0 * (1 + self.spread)))
            if len(str(hi - 1)) <= width:
                break
        return lo, hi, width

    @property
    def line_tokens(self) -> int:
        return self.line_tokens_at(self.line_range[2])

    def trace_tokens(self, lines: int) -> int:
        """Tokens of a right response of ``lines`` lines, EOS included."""
        return lines * self.line_tokens + 1

    @property
    def max_response_tokens(self) -> int:
        return self.trace_tokens(self.line_range[1])

    def sample(self, rng: random.Random) -> Problem:
        lo, hi, width = self.line_range
        n = rng.randint(lo, hi)
        mod, d = 10**self.digits, self.digits
        seq = [rng.randrange(mod) for _ in range(self.terms)]
        out = []
        for i in range(n):
            operands = seq[i: i + self.terms]
            seq.append(sum(operands) % mod)
            order = rng.sample(operands, len(operands))
            out.append(f"{lsd(n - 1 - i, width)}:{'+'.join(lsd(x, d) for x in order)}={lsd(seq[-1], d)}{LINE}")
        prompt = f"fib {lsd(n - 1, width)}:{','.join(lsd(x, d) for x in seq[: self.terms])}{LINE}"
        return Problem(prompt, "".join(out))

    def check(self, response: str, label: str) -> LineCheck:
        """Compare ``response`` line by line with the reference trace ``label``."""
        ref = _lines(label)
        text, stopped = (response.split(EOS, 1)[0], True) if EOS in response else (response, False)
        pieces = text.split(LINE)
        got, complete = pieces[:-1], pieces[-1] == ""  # only lines ended by a line break count
        right = 0
        for mine, theirs in zip(got, ref):
            if _key(mine) is None or _key(mine) != _key(theirs):
                break
            right += 1
        exact = right == len(ref) == len(got) and complete and stopped
        return LineCheck(right, len(ref), exact)

    def reward(self, response: str, label: str) -> float:
        c = self.check(response, label)
        if c.exact:
            return 1.0
        if not self.partial_credit:
            return 0.0
        return min(c.correct_lines, c.lines - 1) / c.lines  # below 1 unless exactly right


def _lines(label: str) -> list[str]:
    if not label.endswith(LINE):
        raise QuantrollError(f"a fib label is lines each ending in a line break; got {label[-20:]!r} at its end")
    return label.split(LINE)[:-1]


def _key(line: str) -> tuple[str, tuple[str, ...], str] | None:
    """(counter, operands sorted, sum) of a well-formed line ``c:x+y=z``, else None."""
    head, colon, rest = line.partition(":")
    ops, eq, total = rest.partition("=")
    parts = ops.split("+")
    fields = [head, total, *parts]
    if not (colon and eq) or not all(f.isdigit() and f.isascii() for f in fields):
        return None
    return head, tuple(sorted(parts)), total

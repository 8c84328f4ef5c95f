"""The fib mixture (the study model's SFT task): every length's problems, with each length's
own counter width, checked by the one line rule."""

import random

import pytest

from quantroll.errors import QuantrollError
from quantroll.tasks.trace import FibTraceTask
from quantroll.tasks.trace_mix import FibTraceMix


def test_the_mixture_draws_every_length_with_its_own_format():
    mix = FibTraceMix(lengths=(60, 2000))
    rng = random.Random(0)
    problems = [mix.sample(rng) for _ in range(200)]
    widths = {len(p.prompt.split(":")[0].split(" ")[1]) for p in problems}
    assert widths == {FibTraceTask(length=60).line_range[2], FibTraceTask(length=2000).line_range[2]} == {1, 3}
    short = [p for p in problems if len(p.label) < 200]
    assert 60 <= len(short) <= 140  # uniform over the two lengths: ~100 of 200 (binomial sd 7)
    assert mix.max_response_tokens == FibTraceTask(length=2000).max_response_tokens
    for p in problems[:20]:
        assert mix.reward(p.label + "<|endoftext|>", p.label) == 1.0
        assert mix.reward(p.label[:-2] + "<|endoftext|>", p.label) == 0.0
        assert mix.check(p.label + "<|endoftext|>", p.label).exact


def test_partial_credit_reaches_the_lengths():
    mix = FibTraceMix(lengths=(60, 120), partial_credit=True)
    p = mix.sample(random.Random(1))
    lines = p.label.split("\n")[:-1]
    cut = "\n".join(lines[:1]) + "\n"
    assert mix.reward(cut + "<|endoftext|>", p.label) == pytest.approx(1 / len(lines))


@pytest.mark.parametrize("kwargs, words", [
    ({"lengths": (60,)}, "at least two"),
    ({"lengths": (60, 60)}, "given twice"),
    ({"lengths": (60, 5)}, "shorter than one line"),
    ({"lengths": (60, 120), "terms": 4}, "--trace-terms must be 2"),
])
def test_bad_mixtures_are_refused(kwargs, words):
    with pytest.raises(QuantrollError, match=words):
        FibTraceMix(**kwargs)

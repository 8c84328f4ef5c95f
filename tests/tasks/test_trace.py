"""The fib long-trace task: its checker on hand-worked traces, its problems against an
independent recomputation, its length formula, and the line break added to the tokenizer."""

import json
import random
from pathlib import Path

import pytest

from quantroll.errors import QuantrollError
from quantroll.tasks.tokenizer import EOS, LINE, build_char_tokenizer, char_vocab, encode
from quantroll.tasks.trace import FibTraceTask

# Worked by hand: mod 100, starts 7 and 5 -> 12, 17, 29; numbers least significant digit first,
# counters 2, 1, 0 (one digit).
PROMPT = "fib 2:70,50\n"
LABEL = "2:70+50=21\n1:50+21=71\n0:21+71=92\n"
TASK = FibTraceTask(length=40, digits=2, spread=0.0)


def test_a_right_trace_scores_1_in_either_operand_order():
    assert TASK.reward(LABEL + EOS, LABEL) == 1.0
    swapped = "2:50+70=21\n1:21+50=71\n0:71+21=92\n"  # the free choice: any order of the operands
    assert TASK.reward(swapped + EOS + "junk after the end", LABEL) == 1.0


@pytest.mark.parametrize("response, right_lines", [
    ("2:70+50=21\n1:50+21=72\n0:21+71=92\n" + EOS, 1),  # one wrong digit of a sum
    ("2:70+50=21\n1:50+21=71\n1:21+71=92\n" + EOS, 2),  # a wrong counter
    ("2:70+50=21\n1:50+31=71\n0:21+71=92\n" + EOS, 1),  # a wrong operand
    ("2:70+50=21\n1:50+21=71\n" + EOS, 2),  # stopped a line early
    ("2:70+50=21\n1:50+21=71\n0:21+71=9", 2),  # truncated mid-line (no EOS)
    ("2:70+50=21\n1:50+21=71\n0:21+71=92\n", 3),  # every line, but never stopped
    ("2:70+50=21\n1:50+21=71\n0:21+71=92\n0:71+92=63\n" + EOS, 3),  # a line too many
    ("2:70+50=21\n1:50+21=71\n0:21+71=92" + EOS, 2),  # the last line break missing
    ("2:70+50=21\n1:50+21=71\n0:21+71=92;\n" + EOS, 2),  # wrong format: a stray character
    ("2:70+50=21\n 1:50+21=71\n0:21+71=92\n" + EOS, 1),  # wrong format: a leading space
    ("2:70+50+21\n1:50+21=71\n0:21+71=92\n" + EOS, 0),  # wrong format: no '='
    ("2:70+50=21\n1:50+21+00=71\n0:21+71=92\n" + EOS, 1),  # wrong format: three operands
    ("", 0), (EOS, 0),
])
def test_a_wrong_trace_scores_0_and_partial_credit_counts_its_leading_right_lines(response, right_lines):
    assert TASK.check(response, LABEL).correct_lines == right_lines
    assert TASK.reward(response, LABEL) == 0.0
    partial = FibTraceTask(length=40, digits=2, spread=0.0, partial_credit=True)
    assert partial.reward(response, LABEL) == pytest.approx(min(right_lines, 2) / 3)
    assert partial.reward(LABEL + EOS, LABEL) == 1.0


def _values(text: str) -> list[int]:
    return [int(x[::-1]) for x in text.replace("+", ",").split(",")]


@pytest.mark.parametrize("terms", [2, 3])
def test_sampled_problems_follow_the_rule_and_the_length_formula(terms):
    task = FibTraceTask(length=600, terms=terms, digits=3)
    lo, hi, width = task.line_range
    rng = random.Random(terms)
    lengths = set()
    for _ in range(20):
        p = task.sample(rng)
        head, starts = p.prompt.removeprefix("fib ").removesuffix(LINE).split(":")
        seq = _values(starts)
        lines = p.label.split(LINE)[:-1]
        assert lo <= len(lines) <= hi and int(head[::-1]) == len(lines) - 1 and len(head) == width
        for i, line in enumerate(lines):  # recomputed here from the integers, not with the task's code
            counter, rest = line.split(":")
            ops, total = rest.split("=")
            assert int(counter[::-1]) == len(lines) - 1 - i and len(counter) == width
            assert sorted(_values(ops)) == sorted(seq[-terms:]) and len(ops) == terms * 4 - 1
            seq.append(sum(seq[-terms:]) % 1000)
            assert int(total[::-1]) == seq[-1] and len(total) == 3
        assert len(encode(p.label)) + 1 == task.trace_tokens(len(lines)) <= task.max_response_tokens
        assert task.reward(p.label + EOS, p.label) == 1.0
        lengths.add(len(lines))
    assert len(lengths) > 1  # the spread gives several lengths
    n0 = round((600 - 1) / task.line_tokens)
    assert (lo, hi) == (int(n0 * 0.8), int(n0 * 1.2))


def test_the_knob_sets_the_length():
    for length in (1024, 4096, 16384):
        task = FibTraceTask(length=length)
        lo, hi, _ = task.line_range
        mid = task.trace_tokens((lo + hi) // 2)
        assert abs(mid - length) < 0.02 * length + task.line_tokens
        assert task.max_response_tokens < 1.21 * length + task.line_tokens


def test_bad_settings_are_refused():
    with pytest.raises(QuantrollError, match="trace-terms"):
        FibTraceTask(terms=4)
    with pytest.raises(QuantrollError, match="trace-len"):
        FibTraceTask(length=10)


def test_the_line_break_is_a_new_id_after_the_old_ones():
    vocab = char_vocab()
    shipped = Path(__file__).resolve().parents[2] / "quantroll/data/tiny-qwen3-arith/tokenizer.json"
    old = json.loads(shipped.read_text())["model"]["vocab"]
    assert {k: v for k, v in vocab.items() if k != LINE} == old  # every existing id unchanged
    assert vocab[LINE] == len(old) < 128  # inside the built-in models' vocabulary
    tok = build_char_tokenizer()
    assert tok.encode("fib 1:2\n3").ids == encode("fib 1:2\n3") and tok.encode("a\nb").ids[1] == vocab[LINE]
    assert tok.decode(encode(LABEL)) == LABEL


def test_train_builds_the_task_and_refuses_a_response_limit_that_cuts_it():
    from quantroll.rl.config import RolloutConfig
    from quantroll.rl.rollout import build_task

    cfg = RolloutConfig(task="fib", trace_len=200, rollout_max_response_len=400, train_problems=8, eval_size=4,
                        eval_interval=1)
    pool, held_out = build_task(cfg)
    assert pool.base == FibTraceTask(length=200) and len(held_out) == 4
    assert not {p.prompt for p in held_out} & {p.prompt for p in pool.problems}
    with pytest.raises(QuantrollError, match="rollout-max-response-len 100 cuts"):
        build_task(RolloutConfig(task="fib", trace_len=200, rollout_max_response_len=100))


def test_train_refuses_a_checkpoint_whose_tokenizer_cannot_write_the_trace(capsys):
    from quantroll.cli import main

    # the shipped arithmetic model's tokenizer predates the line break
    assert main(["train", "--task", "fib", "--trace-len", "100", "--rollout-max-response-len", "200",
                 "--num-rollout", "1", "--device", "cpu"]) == 2
    assert "writes '\\n', which the tokenizer of" in capsys.readouterr().err
    assert main(["train", "--task", "count", "--count-span", "1000", "--rollout-max-response-len", "4000",
                 "--train-problems", "0", "--num-rollout", "1", "--device", "cpu"]) == 2
    assert "context is 2048" in capsys.readouterr().err


def test_fresh_problems_never_include_a_held_out_one():
    """--train-problems 0 draws a new problem each time, but never a held-out one (the
    control: the plain task draws held-out problems within the same number of draws)."""
    import random

    from quantroll.rl.config import RolloutConfig
    from quantroll.rl.rollout import build_task

    fresh, held_out = build_task(RolloutConfig(task="arithmetic", digits=2, train_problems=0, eval_size=16,
                                               eval_interval=1))
    assert len(held_out) == 16
    excluded = fresh.exclude
    assert {p.prompt for p in held_out} <= excluded
    draws = [fresh.sample(random.Random(seed)).prompt for seed in range(2000)]
    assert not set(draws) & excluded
    plain = [fresh.base.sample(random.Random(seed)).prompt for seed in range(2000)]
    assert set(plain) & excluded  # without the exclusion these draws would have hit the held-out set
    assert fresh.reward(held_out[0].label, held_out[0].label) == fresh.base.reward(held_out[0].label, held_out[0].label)

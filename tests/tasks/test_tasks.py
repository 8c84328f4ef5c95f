"""Built-in tasks and the character tokenizer."""

import random

from quantroll.tasks.arithmetic import ArithmeticTask, CountTask
from quantroll.tasks.tokenizer import EOS, build_char_tokenizer, char_vocab, write_char_tokenizer


def test_arithmetic_problems_are_correct_and_rewarded_exactly():
    rng = random.Random(0)
    task = ArithmeticTask(digits=3, ops="+-*")
    for _ in range(200):
        p = task.sample(rng)
        assert eval(p.prompt[:-1]) == int(p.label)  # the label is the true value
        assert task.reward(f"{p.label}{EOS}junk", p.label) == 1.0
        assert task.reward(f" {p.label} ", p.label) == 1.0
        assert task.reward(f"{int(p.label) + 1}", p.label) == 0.0
        assert task.reward("", p.label) == 0.0


def test_count_task_answers_grow_with_span():
    rng = random.Random(1)
    short, long = CountTask(span=4).sample(rng), CountTask(span=64).sample(rng)
    assert len(short.label.split()) == 4 and len(long.label.split()) == 64
    start, end = map(int, long.prompt[len("count "):-1].split(" to "))
    assert long.label == " ".join(str(i) for i in range(start, end + 1))


def test_char_tokenizer_round_trips_and_is_one_token_per_char(tmp_path):
    tok = build_char_tokenizer()
    text = "12*34=408"
    ids = tok.encode(text).ids
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.token_to_id(EOS) == char_vocab()[EOS]
    write_char_tokenizer(tmp_path)
    from tokenizers import Tokenizer

    again = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert again.encode("count 3 to 5:").ids == tok.encode("count 3 to 5:").ids

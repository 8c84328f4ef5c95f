"""Supervised warm start: the loss covers answer + EOS only, training lowers it, the
result is a loadable checkpoint, and the default recipe makes the model answer."""

import json
import random

import pytest
import torch

from quantroll.builtin import TinyQwen3, write_tiny_qwen3
from quantroll.engine import Engine, SamplingParams
from quantroll.tasks.arithmetic import ArithmeticTask
from quantroll.tasks.base import Problem
from quantroll.tasks.tokenizer import EOS, PAD, char_vocab
from quantroll.trainer.policy import load_policy, response_logprobs
from quantroll.sft import (IGNORE, STATS_FILE, build_batch, decode, encode, held_out_problems, lr_at,
                                   sft_example, sft_loss, teacher_forced_correct, train_sft, training_problems,
                                   warm_start)

V = char_vocab()
SMALL = TinyQwen3(intermediate_size=256, num_hidden_layers=2)


def c(s):
    return [V[ch] for ch in s]


def test_batch_labels_cover_answer_and_eos_only_hand_built():
    ids, labels = build_batch([sft_example(Problem("1+2=", "3")), sft_example(Problem("12-34=", "-22"))])
    # row 0: input "1+2=3" (the EOS is only predicted), labels at the positions that predict "3" and EOS
    assert ids[0].tolist() == c("1+2=3") + [V[PAD]] * 4
    assert labels[0].tolist() == [IGNORE] * 3 + c("3") + [V[EOS]] + [IGNORE] * 4
    # row 1: input "12-34=-22", the answer "-22" and EOS predicted from "=", "-", "2", "2"
    assert ids[1].tolist() == c("12-34=-22")
    assert labels[1].tolist() == [IGNORE] * 5 + c("-22") + [V[EOS]]


def test_encode_matches_the_checkpoint_tokenizer_and_decode_inverts_it(tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(write_tiny_qwen3(tmp_path / "t", SMALL) / "tokenizer.json"))
    for text in ("12+34=", "count 3 to 9:", "-7"):
        assert encode(text) == tok.encode(text, add_special_tokens=False).ids
        assert decode(encode(text)) == text
    assert decode(c("46") + [V[EOS]]) == "46<|endoftext|>"


def test_sft_loss_is_the_mean_negative_logprob_of_answer_and_eos_tokens(tmp_path):
    policy = load_policy(write_tiny_qwen3(tmp_path / "m", SMALL, seed=1), dtype=torch.float32)
    examples = [sft_example(p) for p in (Problem("1+2=", "3"), Problem("12-34=", "-22"), Problem("99+99=", "198"))]
    ids, labels = build_batch(examples)
    loss = sft_loss(policy, ids, labels)
    logp, mask = response_logprobs(policy, [p for p, _ in examples], [t for _, t in examples], temperature=1.0)
    assert mask.sum() == 2 + 4 + 4
    assert torch.allclose(loss, -(logp * mask).sum() / mask.sum(), atol=1e-5)


def test_held_out_problems_are_never_trained_on():
    task = ArithmeticTask(digits=1)
    held = held_out_problems(task, 30, seed=0)
    assert len({p.prompt for p in held}) == 30
    train = training_problems(task, random.Random(0), 2000, {p.prompt for p in held})
    assert not {p.prompt for p in train} & {p.prompt for p in held}


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    assert lr_at(0, 100, 1.0, 10, "cosine") == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 10, "cosine") == pytest.approx(1.0)
    assert lr_at(10, 100, 1.0, 10, "cosine") == pytest.approx(1.0)
    assert lr_at(100, 100, 1.0, 10, "cosine") == pytest.approx(0.1)
    assert lr_at(60, 100, 1.0, 10, "constant") == 1.0


def test_short_sft_lowers_the_loss_on_a_fixed_batch(tmp_path):
    torch.manual_seed(0)
    policy = load_policy(write_tiny_qwen3(tmp_path / "m", SMALL, seed=2), dtype=torch.float32)
    task = ArithmeticTask()
    fixed = build_batch([sft_example(p) for p in held_out_problems(task, 32, seed=5)])
    with torch.no_grad():
        before = sft_loss(policy, *fixed).item()
    losses = train_sft(policy, task, steps=40, batch_size=32, lr=3e-3, seed=0, warmup=5, progress=False)
    with torch.no_grad():
        after = sft_loss(policy, *fixed).item()
    assert len(losses) == 40
    assert after < 0.6 * before  # ~4.9 (uniform over 128) -> well below
    assert max(losses[-5:]) < losses[0]


def test_teacher_forced_exact_match_is_greedy_exact_match(tmp_path):
    from quantroll.model.causal_lm import CausalLM

    torch.manual_seed(0)
    policy = load_policy(write_tiny_qwen3(tmp_path / "m", SMALL, seed=4), dtype=torch.float32)
    task = ArithmeticTask(digits=1)
    problems = held_out_problems(task, 60, seed=1)
    train_sft(policy, task, steps=120, batch_size=32, lr=3e-3, seed=0, warmup=5, progress=False)
    forced = teacher_forced_correct(policy, problems)
    served = CausalLM(policy.config, dtype=torch.float32)  # the trained weights in a model the engine prepares
    served.load_state_dict(policy.state_dict())
    engine = Engine.from_model(served, None, "cpu", dtype=torch.float32, stop_ids=(V[EOS],))
    res = engine.generate([encode(p.prompt) for p in problems], SamplingParams(temperature=0.0, max_new_tokens=5))
    greedy = torch.tensor([task.reward(decode(r.tokens), p.label) == 1.0 for r, p in zip(res, problems)])
    assert 0 < int(greedy.sum()) < len(problems)  # a model that is right sometimes: the check means something
    assert torch.equal(forced, greedy)


def test_warm_start_writes_a_checkpoint_everything_loads(tmp_path):
    out = tmp_path / "default"
    stats = warm_start(out, ArithmeticTask(), steps=8, batch_size=16, lr=3e-3, seed=0, shape=SMALL,
                       progress=False, eval_size=16)
    assert stats["eval_size"] == 16 and 0.0 <= stats["accuracy_after"] <= 1.0 and stats["steps_run"] == 8
    assert stats["loss_last"] < stats["loss_first"]
    assert json.loads((out / STATS_FILE).read_text()) == stats
    load_policy(out)
    res = Engine(out).generate([encode("12+34=")])
    assert res[0].tokens
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == SMALL.num_hidden_layers


def test_sft_command_prints_accuracy_and_saves(tmp_path, capsys):
    from quantroll.cli import main

    out = tmp_path / "m"
    assert main(["sft", "--save", str(out), "--steps", "2", "--batch-size", "8", "--eval-size", "8"]) == 0
    text = capsys.readouterr().out
    assert "greedy accuracy on 8 held-out problems: before" in text and "after" in text
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert main(["sft", "--save", str(out), "--digits", "0"]) == 2
    small = ["sft", "--save", str(out), "--steps", "1", "--batch-size", "8", "--eval-size", "8"]
    assert main(small) == 2  # its own checkpoint: replaced only with --force, refused before training
    assert "already holds an output quantroll wrote; pass --force" in capsys.readouterr().err
    before = (out / "model.safetensors").read_bytes()
    assert main([*small, "--seed", "1", "--force"]) == 0
    assert (out / "model.safetensors").read_bytes() != before
    (out / "mine.txt").write_text("the user's")  # issue 41: sft --save used to delete the directory with this in it
    assert main([*small, "--force"]) == 2
    assert "did not write (mine.txt)" in capsys.readouterr().err and (out / "mine.txt").read_text() == "the user's"


@pytest.mark.slow
def test_default_recipe_makes_the_random_model_answer(tmp_path):
    """The default shape, lr, batch and step budget (so the default cosine schedule), stopped
    at a lower validation target to stay near a minute: a random model answers none of the
    held-out problems; after SFT it answers some, on the exported BF16 checkpoint."""
    stats = warm_start(tmp_path / "m", ArithmeticTask(), target_accuracy=0.12, progress=False, eval_size=128)
    assert stats["accuracy_before"] == 0.0
    assert stats["steps_run"] < stats["steps"] and stats["validation"][-1]["accuracy"] >= 0.12
    assert stats["accuracy_after"] >= 0.04, stats

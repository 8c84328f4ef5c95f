"""Held-out evaluation through the engine: the trainer's policy through a BF16 engine copy
gives the greedy tokens of the old full-forward decoding, and the scores come by length."""

import pytest
import torch

from quantroll.builtin import builtin_checkpoint
from quantroll.engine import Engine
from quantroll.evaluation.heldout import greedy, score
from quantroll.evaluation.policy_engine import PolicyEngine
from quantroll.rl.evaluate import evaluate
from quantroll.sft import decode, encode, held_out_problems
from quantroll.tasks.arithmetic import ArithmeticTask
from quantroll.tasks.tokenizer import load_tokenizer
from quantroll.trainer.policy import load_policy
from tests.greedy_reference import greedy_full_forward


def _nudged_policy(path):
    """The built-in policy moved off its checkpoint (BF16-valued, as training leaves it), so that
    the copy must take the policy's weights to agree with it."""
    policy = load_policy(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02 * p.abs().mean()).copy_(p.to(torch.bfloat16).float())
    return policy


def test_the_engine_copy_decodes_the_trainers_policy_as_full_forwards_do():
    path = builtin_checkpoint()
    policy = _nudged_policy(path)
    problems = held_out_problems(ArithmeticTask(), 48, seed=0)
    prompts = [encode(p.prompt) for p in problems]
    copy = PolicyEngine(path, "cpu", torch.float32)
    stop = set(copy.engine.default_stop_ids)
    reference = greedy_full_forward(policy, prompts, 6, stop)
    through_copy = [s.tokens for s in score(copy.engine_for(policy), ArithmeticTask(), problems, encode, decode,
                                            greedy(6))]
    assert through_copy == reference
    checkpoint = [r.tokens for r in Engine(path, dtype=torch.float32).generate(prompts, greedy(6))]
    assert checkpoint != reference  # the nudge changed answers: agreeing above needed the policy's weights


def test_evaluate_reports_both_sides_by_length():
    path = builtin_checkpoint()
    policy = _nudged_policy(path)
    task = ArithmeticTask(digits=2, ops="+-*")  # answers of 1 to 4 characters: buckets 2 and 4 (with EOS)
    problems = held_out_problems(task, 32, seed=1)
    out = evaluate(Engine(path, dtype=torch.float32), PolicyEngine(path, "cpu", torch.float32), policy,
                   load_tokenizer(path), task, problems, 6)
    prompts = [encode(p.prompt) for p in problems]
    reference = greedy_full_forward(policy, prompts, 6, {1})
    right = [task.reward(decode(t), p.label) for t, p in zip(reference, problems)]
    assert out["eval_trainer_accuracy"] == sum(right) / len(problems)
    for side in ("engine", "trainer"):
        by_len = out[f"eval_{side}_by_len"]
        assert set(by_len) == {"2", "4"} and sum(b["n"] for b in by_len.values()) == len(problems)
        assert sum(b["accuracy"] * b["n"] for b in by_len.values()) / len(problems) == \
            pytest.approx(out[f"eval_{side}_accuracy"])


def test_rollout_rewards_by_the_reference_length():
    from types import SimpleNamespace

    from quantroll.rl.rollout import RolloutBatch, rewards_by_length

    labels = ["7", "7", "123", "-45"]  # + EOS: 2, 2, 4, 4 tokens
    batch = RolloutBatch([[5]] * 4, labels, [SimpleNamespace(tokens=[1])] * 4, torch.tensor([1.0, 0.0, 0.5, 1.0]), 1.0)
    assert rewards_by_length(batch, load_tokenizer(builtin_checkpoint())) == {
        "2": {"n": 2, "reward": 0.5, "accuracy": 0.5}, "4": {"n": 2, "reward": 0.75, "accuracy": 0.5}}


def test_the_engine_is_the_trainers_policy_only_for_bf16_weights_kv_and_kernels():
    from quantroll.rl.evaluate import engine_is_trainer_policy

    assert engine_is_trainer_policy(None, "bf16", False)
    assert not engine_is_trainer_policy(object(), "bf16", False)  # a quantized format (FP8, MXFP8, NVFP4)
    assert not engine_is_trainer_policy(None, "fp8_e4m3", False)  # the trainer never attends over an FP8 cache
    assert not engine_is_trainer_policy(None, "bf16", True)  # true on-policy: batch-invariant engine kernels


def test_without_a_copy_the_trainers_side_repeats_the_engines():
    path = builtin_checkpoint()
    task = ArithmeticTask(digits=2, ops="+-*")
    problems = held_out_problems(task, 16, seed=1)
    engine = Engine(path, dtype=torch.float32)
    out = evaluate(engine, None, None, load_tokenizer(path), task, problems, 6)
    both = evaluate(engine, PolicyEngine(path, "cpu", torch.float32), load_policy(path, dtype=torch.float32),
                    load_tokenizer(path), task, problems, 6)
    assert out == both  # the copy of the unchanged weights answers as the engine does
    assert {k for k in out if k.startswith("eval_trainer_")} == {"eval_trainer_accuracy", "eval_trainer_reward",
                                                               "eval_trainer_by_len"}

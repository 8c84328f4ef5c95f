"""User prompt data, custom rewards (and one that raises), held-out evaluation of both policies."""

import json

import pytest

from quantroll.builtin import TinyQwen3, write_tiny_qwen3
from quantroll.cli import main
from quantroll.errors import QuantrollError
from quantroll.rl.config import TrainConfig
from quantroll.rl.loop import run_training
from quantroll.tasks.data import DataTask, load_reward, read_problems

FAST = dict(rollout_batch_size=2, n_samples_per_prompt=2, rollout_max_response_len=3, num_rollout=1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    ckpt = write_tiny_qwen3(root / "bf16", TinyQwen3(num_hidden_layers=1))
    data = root / "train.jsonl"
    data.write_text("\n".join(json.dumps({"q": f"{a}+1=", "a": str(a + 1)}) for a in range(10)) + "\n")
    return ckpt, data


def test_read_problems_and_errors(setup, tmp_path):
    _, data = setup
    problems = read_problems(data, "q", "a")
    assert problems[3].prompt == "3+1=" and problems[3].label == "4"
    with pytest.raises(QuantrollError, match="lacks 'prompt'"):
        read_problems(data, "prompt", "a")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": 1}\nnot json\n')
    with pytest.raises(QuantrollError, match="bad.jsonl:1: 'q' is a number, not a string"):
        read_problems(bad, "q", "a")
    with pytest.raises(QuantrollError, match="module:function|cannot import"):
        load_reward("nonexistent_module_xyz:f")


def test_a_missing_or_empty_file_names_its_flag(setup, tmp_path):
    from quantroll.rl.rollout import build_task

    _, data = setup
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(QuantrollError, match="^--prompt-data .*nope.jsonl not found"):
        build_task(TrainConfig.of(prompt_data=str(tmp_path / "nope.jsonl"), input_key="q", label_key="a").rollout)
    with pytest.raises(QuantrollError, match="^--eval-data .*nope.jsonl not found"):
        build_task(TrainConfig.of(prompt_data=str(data), eval_data=str(tmp_path / "nope.jsonl"), eval_interval=1, input_key="q",
                                  label_key="a").rollout)
    with pytest.raises(QuantrollError, match="^--eval-data .*empty.jsonl holds no rows"):
        build_task(TrainConfig.of(prompt_data=str(data), eval_data=str(tmp_path / "empty.jsonl"), eval_interval=1, input_key="q",
                                  label_key="a").rollout)


def test_custom_reward_is_used(setup):
    task = DataTask(read_problems(setup[1], "q", "a"), load_reward("tests.rl.rewards_for_tests:length_reward"))
    assert task.reward("abc", "x") == 1.0 and task.reward("ab", "x") == 0.0


def test_train_on_user_data_with_eval_of_both_policies(setup, tmp_path):
    ckpt, data = setup
    hist = run_training(TrainConfig.of(hf_checkpoint=str(ckpt), prompt_data=str(data), input_key="q", label_key="a",
                                    eval_data=str(data), eval_interval=1, **FAST), progress=False)
    assert 0.0 <= hist[0]["eval_engine_accuracy"] <= 1.0 and 0.0 <= hist[0]["eval_trainer_accuracy"] <= 1.0


def test_a_reward_function_that_raises_stops_the_run_with_the_sample(setup, capsys):
    ckpt, data = setup
    rc = main(["train", "--hf-checkpoint", str(ckpt), "--prompt-data", str(data), "--input-key", "q", "--label-key",
               "a", "--custom-rm-path", "tests.rl.rewards_for_tests:broken_reward", "--num-rollout", "1",
               "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "2",
               "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "reward function (--custom-rm-path tests.rl.rewards_for_tests:broken_reward) raised on " \
        "sample 0" in err and "reward server down" in err


def test_tensorboard_gets_the_same_scalars(setup, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ckpt, _ = setup
    hist = run_training(TrainConfig.of(hf_checkpoint=str(ckpt), tensorboard_dir=str(tmp_path / "tb"), **FAST),
                        progress=False)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert "train_rollout_logprob_abs_diff" in scalars and "reward_mean" in scalars
    value = acc.Scalars("train_rollout_logprob_abs_diff")[0].value
    assert value == pytest.approx(hist[0]["train_rollout_logprob_abs_diff"], rel=1e-6)


def test_save_hf_exports_the_trained_policy_for_convert(setup, tmp_path):
    import torch

    from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
    from quantroll.trainer.policy import load_policy

    ckpt, data = setup
    out = tmp_path / "hf"
    run_training(TrainConfig.of(hf_checkpoint=str(ckpt), save_hf=str(out), **{**FAST, "lr": 1e-2}), progress=False)
    exported = load_policy(out)
    original = load_policy(ckpt)
    assert set(dict(exported.named_parameters())) == set(dict(original.named_parameters()))
    convert_checkpoint(out, tmp_path / "fp8", ConvertConfig(format="fp8", progress=False))
    assert (tmp_path / "fp8" / "config.json").is_file()
    # all rewards are 0 for a random model, so GRPO advantages are 0 and the weights are the initial ones
    for (name, a), (_, b) in zip(sorted(exported.named_parameters()), sorted(original.named_parameters())):
        assert torch.equal(a, b), name

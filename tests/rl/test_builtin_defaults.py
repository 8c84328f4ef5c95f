"""`quantroll train` on its built-in default: the shipped warm-started models, the flags
that convert for the engine (--rollout-precision, BF16 layers at the ends), the training
pool, float32 compute on CPU with BF16-valued weights, and forced-length rollouts."""

import json
import random

import pytest
import torch

from quantroll.builtin import BUILTIN_MODELS, builtin_checkpoint
from quantroll.cli import main
from quantroll.rl.config import TrainConfig
from quantroll.rl.loop import run_training
from quantroll.tasks.arithmetic import ArithmeticTask
from quantroll.tasks.base import PoolTask
from quantroll.trainer.optimizer import MasterWeightAdamW
from quantroll.sft import held_out_problems

TINY = dict(num_rollout=2, rollout_batch_size=4, n_samples_per_prompt=2)


@pytest.mark.parametrize("kind", sorted(BUILTIN_MODELS))
def test_shipped_models_are_warm_started_bf16_checkpoints(kind):
    path = builtin_checkpoint(kind)
    stats = json.loads((path / "quantroll_sft.json").read_text())
    assert stats["accuracy_before"] == 0.0 and 0.3 < stats["accuracy_after"] < 0.7
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == ("qwen3_moe" if kind == "moe" else "qwen3")


def test_no_model_flags_trains_the_builtin_model_bf16_gap_near_zero_fp8_gap_clearly_above():
    bf16 = run_training(TrainConfig.of(**TINY), progress=False)
    fp8 = run_training(TrainConfig.of(**TINY, rollout_precision="fp8"), progress=False)
    assert bf16[0]["rollout_precision"] == "bfloat16 (float32 compute)"
    assert fp8[0]["rollout_precision"] == "fp8 (emulated)"
    assert bf16[0]["train_rollout_logprob_abs_diff"] < 1e-5
    assert fp8[0]["train_rollout_logprob_abs_diff"] > 100 * bf16[0]["train_rollout_logprob_abs_diff"]
    assert fp8[0]["weight_quantize_time"] > 0 and fp8[0]["engine_weight_gib"] < bf16[0]["engine_weight_gib"]


def test_moe_builtin_trains_with_r3_and_tis_and_reports_routing_per_layer():
    history = run_training(TrainConfig.of(**TINY, builtin_model="moe", rollout_precision="fp8",
                                       use_rollout_routing_replay=True, use_tis=True), progress=False)
    layers = [k for k in history[0] if k.startswith("routing_agreement_layer")]
    assert len(layers) == 4 and all(0.0 <= history[0][k] <= 1.0 for k in layers)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in history)


def test_bf16_layers_at_the_ends_are_kept_on_both_sides(tmp_path):
    run_training(TrainConfig.of(**TINY, rollout_precision="fp8", train_recipe="fp8", num_layers_at_start_in_bf16=1,
                             num_layers_at_end_in_bf16=1, convert_dir=str(tmp_path / "engine")), progress=False)
    kept = json.loads((tmp_path / "engine" / "config.json").read_text())["quantization_config"]["modules_to_not_convert"]
    assert any(m.startswith("model.layers.0.") for m in kept) and any(m.startswith("model.layers.3.") for m in kept)
    assert not any(m.startswith(("model.layers.1.mlp", "model.layers.2.mlp")) for m in kept)


@pytest.mark.parametrize("argv, words", [
    (["--num-layers-at-start-in-bf16", "1"], "need a low-precision rollout"),
    (["--rollout-precision", "fp8", "--ref-load", "elsewhere"], "--ref-load is not used"),
])
def test_conflicting_model_flags_are_refused(argv, words, capsys):
    assert main(["train", "--num-rollout", "1", *argv]) == 2
    assert words in capsys.readouterr().err


def test_rollout_precision_refuses_an_already_quantized_checkpoint(tmp_path, capsys):
    from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint

    convert_checkpoint(builtin_checkpoint(), tmp_path / "fp8", ConvertConfig(format="fp8", progress=False))
    assert main(["train", "--hf-checkpoint", str(tmp_path / "fp8"), "--rollout-precision", "mxfp8"]) == 2
    assert "already quantized" in capsys.readouterr().err


def test_ignore_eos_samples_every_response_to_full_length():
    history = run_training(TrainConfig.of(**TINY, rollout_max_response_len=12, rollout_ignore_eos=True), progress=False)
    assert all(r["response_len_mean"] == 12 for r in history)


def test_training_pool_is_fixed_distinct_and_never_held_out():
    task = ArithmeticTask()
    held_out = {p.prompt for p in held_out_problems(task, 256, seed=0)}
    pool = PoolTask.draw(task, 64, seed=3, exclude=frozenset(held_out))
    prompts = [p.prompt for p in pool.problems]
    assert len(set(prompts)) == 64 and not set(prompts) & held_out
    assert PoolTask.draw(task, 64, seed=3, exclude=frozenset(held_out)).problems == pool.problems
    assert PoolTask.draw(task, 64, seed=4, exclude=frozenset(held_out)).problems != pool.problems
    rng = random.Random(0)
    assert {pool.sample(rng).prompt for _ in range(2000)} == set(prompts)
    p = pool.problems[0]
    assert pool.reward(p.label + "<|endoftext|>", p.label) == 1.0


def test_float32_compute_keeps_bf16_valued_weights_through_updates():
    p = torch.nn.Parameter(torch.randn(64, 64).to(torch.bfloat16).float())
    opt = MasterWeightAdamW([p], lr=1e-3)
    for _ in range(3):
        p.grad = torch.randn(64, 64)
        opt.step()
        assert torch.equal(p.data, p.data.to(torch.bfloat16).float())  # representable in BF16
    assert not torch.equal(opt.master[0], p.data)  # the FP32 master keeps what BF16 drops


def test_batched_trainer_greedy_equals_the_engines_greedy():
    from quantroll.engine import Engine, SamplingParams
    from tests.greedy_reference import greedy_full_forward
    from quantroll.trainer.policy import load_policy

    path = builtin_checkpoint()
    engine = Engine(path, dtype=torch.float32)
    policy = load_policy(path, dtype=torch.float32)
    prompts = [[5 + i % 20] * (3 + i % 4) for i in range(12)]
    engine_out = [r.tokens for r in engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=6))]
    assert greedy_full_forward(policy, prompts, 6, set(engine.default_stop_ids)) == engine_out

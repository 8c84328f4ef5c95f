"""`quantroll train` end to end on tiny checkpoints (CPU): metrics lines, the step-0 gap
with BF16 and FP8 rollout, mode-1 refusal, TIS, mode 2, and routing replay on MoE."""

import json

import pytest
import torch

from quantroll.builtin import TinyQwen3, write_tiny_qwen3
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.cli import main
from quantroll.rl.config import TrainConfig
from quantroll.rl.loop import run_training

SMALL = TinyQwen3(num_hidden_layers=2)
FAST = dict(rollout_batch_size=2, n_samples_per_prompt=2, rollout_max_response_len=4, num_rollout=2, lr=1e-4)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    bf16 = write_tiny_qwen3(root / "bf16", SMALL)
    fp8 = root / "fp8"
    convert_checkpoint(bf16, fp8, ConvertConfig(format="fp8", progress=False))
    return bf16, fp8


def test_bf16_and_fp8_rollout_step0_gap_and_metrics_lines(ckpts, tmp_path):
    bf16, fp8 = ckpts
    runs = {}
    for name, engine_dir in (("bf16", bf16), ("fp8", fp8)):
        path = tmp_path / f"{name}.jsonl"
        run_training(TrainConfig.of(hf_checkpoint=str(engine_dir), ref_load=str(bf16), metrics_file=str(path), **FAST),
                     progress=False)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert [r["step"] for r in lines] == [0, 1]
        for key in ("train_rollout_logprob_abs_diff", "train_rollout_kl", "log_ppl_diff", "ppl_ratio", "chi2_token",
                    "chi2_seq", "reward_mean", "reward_std", "accuracy", "response_len_mean", "pg_clipfrac", "grad_norm",
                    "rollout_time", "train_time", "weight_quantize_time", "weight_load_time", "weight_copy_time",
                    "rollout_tokens_per_s",
                    "peak_memory_gib", "engine_weight_gib", "trainer_weight_gib", "trainer_optimizer_gib"):
            assert key in lines[0], key
        runs[name] = lines[0]["train_rollout_logprob_abs_diff"]
    # BF16 engine vs BF16 trainer differ only by kernel order; FP8 rollout adds its rounding
    assert runs["bf16"] < 5e-3 and runs["fp8"] > 3 * runs["bf16"], runs


def _stored_bytes(directory) -> int:
    """Every tensor of a checkpoint at its stored dtype, read with the safetensors library."""
    from safetensors import safe_open

    total = 0
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), "pt") as handle:
            for name in handle.keys():
                t = handle.get_tensor(name)
                total += t.numel() * t.element_size()
    return total


def test_memory_counts_weights_as_stored_not_the_cpu_compute_copy(ckpts):
    bf16, fp8 = ckpts
    hist = {name: run_training(TrainConfig.of(hf_checkpoint=str(d), ref_load=str(bf16), **{**FAST, "num_rollout": 1}),
                               progress=False)[0] for name, d in (("bf16", bf16), ("fp8", fp8))}
    assert hist["bf16"]["rollout_precision"] == "bfloat16 (float32 compute)"  # held as float32, counted as BF16
    for name, d in (("bf16", bf16), ("fp8", fp8)):
        assert hist[name]["engine_weight_gib"] * 2**30 == pytest.approx(_stored_bytes(d), rel=1e-12), name
        assert hist[name]["trainer_weight_gib"] * 2**30 == pytest.approx(_stored_bytes(bf16), rel=1e-12), name
    n_params = sum(p.numel() for p in load_policy_params(bf16))
    # FP32 master + AdamW's two moments (and torch's per-tensor step counters, a few bytes)
    assert hist["bf16"]["trainer_optimizer_gib"] * 2**30 == pytest.approx(3 * 4 * n_params, rel=1e-4)


def load_policy_params(path):
    from quantroll.trainer.policy import load_policy

    return list(load_policy(path).parameters())


def test_every_step_splits_the_gap_by_response_length(ckpts):
    bf16, fp8 = ckpts
    hist = run_training(TrainConfig.of(hf_checkpoint=str(fp8), ref_load=str(bf16), **{**FAST, "rollout_batch_size": 4,
                                                                                 "rollout_max_response_len": 12}),
                        progress=False)
    for r in hist:
        buckets = r["by_response_len"]
        assert all(int(b) & (int(b) - 1) == 0 for b in buckets)  # powers of two
        assert sum(b["tokens"] for b in buckets.values()) == r["mismatch_tokens"]
        tokens = sum(b["tokens"] for b in buckets.values())
        weighted = sum(b["train_rollout_logprob_abs_diff"] * b["tokens"] for b in buckets.values()) / tokens
        assert weighted == pytest.approx(r["train_rollout_logprob_abs_diff"], rel=1e-9)


def test_held_out_eval_at_step_0_every_interval_and_the_last_step(ckpts):
    from quantroll.tasks.tokenizer import load_tokenizer
    from quantroll.engine import Engine
    from quantroll.evaluation.policy_engine import PolicyEngine
    from quantroll.rl.evaluate import evaluate
    from quantroll.rl.rollout import build_task
    from quantroll.trainer.policy import load_policy

    bf16, _ = ckpts
    cfg = TrainConfig.of(hf_checkpoint=str(bf16), eval_interval=2, eval_size=8, **{**FAST, "num_rollout": 4,
                                                                               "lr": 1e-2})
    hist = run_training(cfg, progress=False)
    assert [r["step"] for r in hist if "eval_engine_accuracy" in r] == [0, 2, 3]
    assert all("eval_trainer_accuracy" in r for r in hist if "eval_engine_accuracy" in r)
    for r in hist:  # the rollout's reward by reference-length bucket recombines to the step's mean
        n = sum(b["n"] for b in r["reward_by_len"].values())
        assert n == FAST["rollout_batch_size"] * FAST["n_samples_per_prompt"]
        assert sum(b["reward"] * b["n"] for b in r["reward_by_len"].values()) / n == pytest.approx(r["reward_mean"])
    # step 0's accuracies are those of the initial weights, before any update
    task, problems = build_task(cfg.rollout)
    dtype = torch.float32
    fresh = evaluate(Engine(bf16, dtype=dtype), PolicyEngine(bf16, "cpu", dtype), load_policy(bf16, dtype=dtype),
                     load_tokenizer(bf16), task, problems, cfg.rollout.rollout_max_response_len)
    assert {"eval_engine_reward", "eval_trainer_reward", "eval_engine_by_len", "eval_trainer_by_len"} <= set(fresh)
    assert {k: hist[0][k] for k in fresh} == fresh


def test_quantized_engine_without_ref_load_is_refused(ckpts, capsys):
    _, fp8 = ckpts
    rc = main(["train", "--hf-checkpoint", str(fp8), "--num-rollout", "1", "--device", "cpu"])
    assert rc == 2
    assert "must not train on quantized weights" in capsys.readouterr().err


def test_tis_mode2_and_weight_update_check_run(ckpts, tmp_path):
    bf16, fp8 = ckpts
    hist = run_training(TrainConfig.of(hf_checkpoint=str(fp8), ref_load=str(bf16), use_tis=True, train_recipe="fp8",
                                    check_weight_update_equal=True, **FAST), progress=False)
    assert "tis" in hist[0] and "ess_ratio" in hist[0]
    assert hist[-1]["weight_version"] >= 3  # the checked first update + one per step


@pytest.mark.parametrize("minibatch", [None, 2])
def test_routing_replay_on_moe_forces_engine_experts_and_trains_the_router(tiny_qwen3_moe_dir, minibatch):
    from quantroll.engine import Engine, SamplingParams
    from quantroll.rl.rollout import RolloutBatch
    from quantroll.rl.routing import replay_from_engine
    from quantroll.rl.step import train_on_batch
    from quantroll.trainer.optimizer import MasterWeightAdamW
    from quantroll.trainer.policy import load_policy, response_logprobs

    engine = Engine(tiny_qwen3_moe_dir)
    policy = load_policy(tiny_qwen3_moe_dir)
    prompts = [[5, 6, 7, 8, 9, 11], [5, 6, 7, 8, 9, 11], [9, 10], [9, 10]]  # minibatches of different lengths
    results = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=5, stop_token_ids=(), seed=1))
    batch = RolloutBatch(prompts, ["x"] * 4, results, torch.tensor([1.0, 0.0, 0.0, 1.0]), 1.0)
    cfg = TrainConfig.of(hf_checkpoint=str(tiny_qwen3_moe_dir), use_rollout_routing_replay=True, n_samples_per_prompt=2,
                      lr=1e-3, global_batch_size=minibatch)
    # under replay the trainer's expert choices are the engine's, position by position
    replay = replay_from_engine([r.routed_experts for r in results], prompts, [r.tokens for r in results],
                                policy.config.moe_layers, policy.config.num_experts_per_tok)
    with torch.no_grad():
        response_logprobs(policy, prompts, [r.tokens for r in results], 1.0, replay)
    for layer, table in replay.chosen.items():
        rows = table.view(4, -1, table.shape[-1])
        for i, r in enumerate(results):
            n = len(prompts[i]) + len(r.tokens) - 1
            assert torch.equal(rows[i, :n], r.routed_experts[:, cfg_layer_slot(policy, layer)].long())
    before = policy.model.layers[0].mlp.gate.weight.detach().clone()
    metrics = train_on_batch(cfg, policy, None, MasterWeightAdamW(policy.parameters(), lr=1e-3), batch)
    assert any(k.startswith("routing_agreement_layer") for k in metrics)
    assert metrics["grad_norm"] > 0
    assert not torch.equal(before, policy.model.layers[0].mlp.gate.weight.detach())  # the router still learns


def cfg_layer_slot(policy, layer):
    return policy.config.moe_layers.index(layer)


def test_nonfinite_losses_skip_steps_then_stop_the_run(ckpts, monkeypatch, tmp_path):
    import quantroll.rl.step as step_module
    from quantroll.errors import QuantrollError

    bf16, _ = ckpts
    real = step_module.ppo_policy_loss

    def nan_loss(*args, **kwargs):
        loss, clipped = real(*args, **kwargs)
        return loss * float("nan"), clipped

    monkeypatch.setattr(step_module, "ppo_policy_loss", nan_loss)
    path = tmp_path / "nan.jsonl"
    with pytest.raises(QuantrollError, match="3 steps in a row had a NaN/Inf loss"):
        run_training(TrainConfig.of(hf_checkpoint=str(bf16), metrics_file=str(path), max_bad_steps=3,
                                 **{**FAST, "num_rollout": 5}), progress=False)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 2 and all(r["skipped_nonfinite"] == 1 for r in lines)  # logged, then the third stops it


def test_save_and_resume_continue_the_metrics_without_gaps_or_repeats(ckpts, tmp_path):
    bf16, _ = ckpts
    metrics, save = tmp_path / "m.jsonl", tmp_path / "state"
    cfg = dict(hf_checkpoint=str(bf16), metrics_file=str(metrics), save=str(save), save_interval=2,
               **{**FAST, "num_rollout": 3})
    run_training(TrainConfig.of(**{**cfg, "num_rollout": 3}), progress=False)  # saves after steps 1 and 2
    # simulate a crash after step 3 was logged but before its save: append a stray line
    with open(metrics, "a") as f:
        f.write(json.dumps({"step": 3, "stray": True}) + "\n")
    hist = run_training(TrainConfig.of(**{**cfg, "num_rollout": 5, "load": str(save)}), progress=False)
    assert [h["step"] for h in hist] == [3, 4]
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]
    assert not any(json.loads(x).get("stray") for x in metrics.read_text().splitlines())


def test_resume_reproduces_an_uninterrupted_run(ckpts, tmp_path):
    bf16, _ = ckpts
    base = dict(hf_checkpoint=str(bf16), **{**FAST, "num_rollout": 3, "lr": 1e-3})
    straight = run_training(TrainConfig.of(**base), progress=False)
    save = tmp_path / "s"
    run_training(TrainConfig.of(**{**base, "num_rollout": 2, "save": str(save), "save_interval": 2}), progress=False)
    resumed = run_training(TrainConfig.of(**{**base, "load": str(save)}), progress=False)
    assert resumed[0]["step"] == 2
    assert resumed[0]["response_len_mean"] == straight[2]["response_len_mean"]
    assert resumed[0]["train_rollout_logprob_abs_diff"] == pytest.approx(straight[2]["train_rollout_logprob_abs_diff"],
                                                                         rel=1e-6)


@pytest.mark.parametrize("other", [TinyQwen3(num_hidden_layers=1), TinyQwen3(num_hidden_layers=2, intermediate_size=512)])
def test_resume_into_another_model_names_the_tensor_and_the_flag(ckpts, tmp_path, other):
    """A save of a 2-layer model resumed with a checkpoint that lacks a layer, or whose
    MLP is narrower: one line naming the first tensor that differs and the flag the
    trainer's model came from (it used to blame --ref-load, or raise torch's size error)."""
    from quantroll.errors import QuantrollError

    bf16, _ = ckpts
    save = tmp_path / "s"
    run_training(TrainConfig.of(hf_checkpoint=str(bf16), save=str(save), save_interval=1, **{**FAST, "num_rollout": 1}),
                 progress=False)
    elsewhere = write_tiny_qwen3(tmp_path / "other", other)
    with pytest.raises(QuantrollError, match=r"^--load .*(has model\.layers\.1\..*which --hf-checkpoint's model lacks"
                                             r"|the saved model\.layers\.0\.mlp\.\w+_proj\.weight is \[\d+, \d+\] but "
                                             r"--hf-checkpoint's model has)"):
        run_training(TrainConfig.of(hf_checkpoint=str(elsewhere), load=str(save), **{**FAST, "num_rollout": 2}),
                     progress=False)


def test_num_continuous_decode_steps_reaches_both_engines_and_leaves_the_run_as_it_is(tmp_path, monkeypatch):
    """The built-in warm-started model answers in a few tokens, so responses stop inside chunks
    of 3 and rewards are not all zero: every metric but the timings and memory must be equal."""
    from quantroll.engine.engine import Engine
    from quantroll.errors import QuantrollError

    made = []
    setup = Engine._setup

    def recording(self, *args, **kwargs):
        setup(self, *args, **kwargs)
        made.append(self.scheduler_config.decode_steps)

    monkeypatch.setattr(Engine, "_setup", recording)
    runs = {}
    for steps in (None, 3):
        made.clear()
        path = tmp_path / f"{steps}.jsonl"
        run_training(TrainConfig.of(metrics_file=str(path), rollout_batch_size=4, n_samples_per_prompt=2,
                                    rollout_max_response_len=8, num_rollout=2, lr=1e-4, eval_interval=1, eval_size=8,
                                    num_continuous_decode_steps=steps, kv_cache_dtype="fp8_e4m3"), progress=False)
        runs[steps] = [json.loads(line) for line in path.read_text().splitlines()]
        # the rollout engine (FP8 KV) and the held-out evaluation's BF16-KV copy of the trainer's policy (CPU default: 1)
        assert made == ([1, 1] if steps is None else [3, 3])
    assert len(runs[None]) == len(runs[3]) == 2
    timing = ("time", "tokens_per_s", "peak_memory")
    for a, b in zip(runs[None], runs[3]):
        assert {k: v for k, v in a.items() if not any(t in k for t in timing)} == \
            {k: v for k, v in b.items() if not any(t in k for t in timing)}
    assert any(r["reward_mean"] > 0 for r in runs[3]) and all(r["response_len_mean"] < 8 for r in runs[3])
    with pytest.raises(QuantrollError, match="num-continuous-decode-steps must be >= 1"):
        TrainConfig.of(num_continuous_decode_steps=0)


def test_a_bf16_run_evaluates_through_its_engine_and_an_fp8_run_builds_the_bf16_copy(ckpts, monkeypatch):
    """A BF16 engine is the trainer's policy: a copy would decode the same tokens again."""
    import quantroll.rl.loop as loop

    built = []

    class Counting(loop.PolicyEngine):
        def __init__(self, *args, **kwargs):
            built.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(loop, "PolicyEngine", Counting)
    bf16, fp8 = ckpts
    for engine_dir, copies in ((bf16, 0), (fp8, 1)):
        built.clear()
        hist = run_training(TrainConfig.of(hf_checkpoint=str(engine_dir), ref_load=str(bf16), eval_interval=1,
                                           eval_size=4, **FAST), progress=False)
        assert len(built) == copies, engine_dir
        assert all("eval_trainer_accuracy" in r and "eval_engine_by_len" in r for r in hist)
        if not copies:
            assert all(r["eval_trainer_by_len"] == r["eval_engine_by_len"] for r in hist)

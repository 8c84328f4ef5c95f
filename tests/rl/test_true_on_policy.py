"""``quantroll train --true-on-policy-mode`` on the built-in models (CPU): the gap between
the engine's reported logprobs and the trainer's is exactly 0.0 at every step, for BF16 and
mode 2, dense and MoE, with prompts of different lengths, temperatures 1 and 0.7, top-p < 1,
and a KV budget so small that the engine preempts and shares prompt prefixes. Negative
controls: without the mode the CPU gap is not 0, and one flipped bit in one engine weight
makes the mode's gap nonzero. Refusals where the mode cannot hold."""

import json

import pytest
import torch

from quantroll.builtin import builtin_checkpoint
from quantroll.cli import main
from quantroll.engine import CacheConfig, Engine, SamplingParams
from quantroll.errors import QuantrollError
from quantroll.model.kernel_config import INVARIANT_KERNELS
from quantroll.rl.config import TrainConfig
from quantroll.rl.loop import run_training
from quantroll.trainer.policy import load_policy, response_logprobs

# prompts of 6 to 27 characters (one token each): the long ones fill whole KV blocks of 16,
# so the n samples of a prompt share them
PROMPTS = [("12+34=", "46"), ("1+2+3+4+5+6+7+8+9=", "45"), ("10+20+30+40+50+60+70+80=", "360"), ("7-3=", "4"),
           ("11+22+33+44+55+66+77+88+9=", "405"), ("99-9=", "90")]
KV_GB = 14.5 * 16448 / 2**30  # 14 blocks of 4 tokens in float32 (MoE routes included): sequences wait for blocks


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("top") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "label": a}) + "\n" for p, a in PROMPTS))
    return str(path)


def _run(tmp_path, prompt_file, **kw) -> list[dict]:
    cfg = dict(prompt_data=prompt_file, rollout_batch_size=3, n_samples_per_prompt=3, rollout_max_response_len=8,
               num_rollout=2, kv_cache_memory_gb=KV_GB, kv_cache_block_size=4, metrics_file=str(tmp_path / "m.jsonl"),
               lr=1e-3)
    cfg.update(kw)
    run_training(TrainConfig.of(**cfg), progress=False, log=lambda *_: None)
    return [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]


CASES = {
    "dense-bf16-t1": dict(builtin_model="dense"),
    "dense-mode2-t07-topp": dict(builtin_model="dense", rollout_precision="fp8", train_recipe="fp8",
                                 rollout_temperature=0.7, rollout_top_p=0.8, use_tis=True),
    "moe-bf16-t07-r3": dict(builtin_model="moe", rollout_temperature=0.7, use_rollout_routing_replay=True),
    "moe-mode2-t1-topp-mask": dict(builtin_model="moe", rollout_precision="fp8", train_recipe="fp8", rollout_top_p=0.9,
                                   use_tis=True, tis_mode="mask"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gap_is_exactly_zero_at_every_step(case, tmp_path, prompt_file):
    lines = _run(tmp_path, prompt_file, true_on_policy_mode=True, **CASES[case])
    assert [r["step"] for r in lines] == [0, 1]
    for r in lines:
        assert r["true_on_policy"] is True
        assert r["train_rollout_logprob_abs_diff"] == 0.0, (case, r["step"])
        assert r["train_rollout_kl"] == 0.0 and r["chi2_token"] == 0.0
        assert r["train_first_forward_logprob_abs_diff"] == 0.0  # the first minibatch's forward, too
        assert r["pg_clipfrac"] == 0.0  # the PPO ratio of the first (only) minibatch is exactly 1
        if r.get("tis") is not None:
            assert r["tis"] == r["tis_ratio_min"] == r["tis_ratio_max"] == 1.0
            assert r.get("masked_fraction", 0.0) == 0.0 and r.get("tis_clipfrac", 0.0) == 0.0
        routing = [v for k, v in r.items() if k.startswith("routing_agreement_layer")]
        assert routing == ([1.0] * 4 if "moe" in case else [])
    # the n samples of a prompt shared its blocks (preemption: test_preemption_and_sharing_change_no_bit below)
    assert sum(r["rollout_prefill_tokens_saved"] for r in lines) > 0


def test_without_the_mode_the_cpu_gap_is_not_zero(tmp_path, prompt_file):
    """The negative control of the tests above: the ordinary kernels differ between the
    engine's batches and the trainer's, so the same run measures a gap (~1e-7)."""
    lines = _run(tmp_path, prompt_file, num_rollout=1, builtin_model="dense", rollout_ignore_eos=False)
    assert lines[0]["train_rollout_logprob_abs_diff"] > 0.0


@torch.no_grad()
def _gap(engine, policy, prompts, params) -> float:
    results = engine.generate(prompts, params)
    logp, mask = response_logprobs(policy, [r.prompt_tokens for r in results], [r.tokens for r in results],
                                   params.temperature)
    rollout = torch.zeros_like(logp)
    for i, r in enumerate(results):
        rollout[i, :len(r.logprobs)] = torch.tensor(r.logprobs)
    return float(((logp - rollout).abs() * mask).sum() / mask.sum())


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_preemption_and_sharing_change_no_bit(model):
    """A pool so small that the engine preempts (and recomputes) sequences, sharing prompt
    blocks: every logprob still equals the trainer's, bit for bit."""
    ckpt = builtin_checkpoint(model)
    probe = Engine(ckpt, dtype=torch.float32, kernels=INVARIANT_KERNELS, cache=CacheConfig(block_size=4))
    gib = 12.5 * probe._block_bytes() / 2**30
    engine = Engine(ckpt, dtype=torch.float32, kernels=INVARIANT_KERNELS, cache=CacheConfig(block_size=4, memory_gb=gib))
    policy = load_policy(ckpt, dtype=torch.float32, kernels=INVARIANT_KERNELS)
    prompts = [list(range(3, 3 + n)) for n in (5, 9, 13) for _ in range(2)]
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12, seed=5, stop_token_ids=())
        assert _gap(engine, policy, prompts, params) == 0.0
        assert engine.last_stats["preemptions"] > 0 and engine.last_stats["prefill_tokens_saved"] > 0


@torch.no_grad()
def test_one_flipped_bit_in_one_engine_weight_makes_the_gap_nonzero():
    """The mode's zero is a comparison that can fail: the last bit of one engine weight
    (not the trainer's) flipped gives a nonzero gap."""
    ckpt = builtin_checkpoint("dense")
    engine = Engine(ckpt, dtype=torch.float32, kernels=INVARIANT_KERNELS, cache=CacheConfig(memory_gb=0.01))
    policy = load_policy(ckpt, dtype=torch.float32, kernels=INVARIANT_KERNELS)
    prompts = [[5, 6, 7, 8][: 1 + i % 4] for i in range(6)]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)
    assert _gap(engine, policy, prompts, params) == 0.0
    w = engine.model.model.layers[0].self_attn.q_proj.weight
    bits = w.data.view(torch.int32)
    bits[0, 0] ^= 1 << 16  # the last bit of a BF16 value held in float32 (its low 16 bits are zero)
    engine.model.model.layers[0].self_attn.q_proj.invalidate()
    assert _gap(engine, policy, prompts, params) > 0.0


@pytest.mark.parametrize("flags,message", [
    (["--rollout-precision", "fp8"], "cannot hold in mode 1"),
    (["--kv-cache-dtype", "fp8_e4m3"], "cannot hold with --kv-cache-dtype fp8_e4m3"),
    (["--rollout-precision", "nvfp4", "--fp4-recipe", "nvfp4"], "amax over the whole tensor"),
    (["--rollout-precision", "mxfp8", "--fp8-recipe", "mxfp8"], "--fp8-recipe mxfp8 is not tested in it yet"),
])
def test_refused_where_it_cannot_hold(flags, message, capsys):
    assert main(["train", "--true-on-policy-mode", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_the_gpu_is_accepted_and_refused_for_the_same_reasons_as_the_cpu():
    """On the GPU the mode runs the Triton forms of the invariant ops (bitwise tests in
    tests/engine/test_true_on_policy_gpu.py); its refusals do not depend on the device."""
    from quantroll.rl.true_on_policy import config_refusal

    assert config_refusal(TrainConfig.of(true_on_policy_mode=True, device="cuda")) is None
    cfg = TrainConfig.of(true_on_policy_mode=True, device="cuda", rollout_precision="fp8", train_recipe="fp8")
    assert config_refusal(cfg) is None
    with pytest.raises(QuantrollError, match="cannot hold with --kv-cache-dtype fp8_e4m3"):
        TrainConfig.of(true_on_policy_mode=True, device="cuda", kv_cache_dtype="fp8_e4m3")


def test_a_nonzero_gap_stops_the_run_after_writing_its_step(tmp_path, prompt_file, monkeypatch):
    """The mode never runs approximately: an engine whose reported logprobs are off by 1e-6
    (a broken invariant op) stops the run at step 0, with one line, step 0's metrics kept."""
    from quantroll.engine import sampling

    exact = sampling.reported_logprobs
    monkeypatch.setattr(sampling, "reported_logprobs", lambda *a, **k: exact(*a, **k) + 1e-6)
    gap = r"did not hold at step 0: train_rollout_logprob_abs_diff is [0-9.]+e-0[67], not 0"
    with pytest.raises(QuantrollError, match=gap):
        _run(tmp_path, prompt_file, builtin_model="dense", true_on_policy_mode=True)
    steps = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [0] and steps[0]["train_rollout_logprob_abs_diff"] > 0


def test_refused_for_a_quantized_engine_checkpoint_without_a_recipe(tmp_path):
    from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint

    fp8 = tmp_path / "fp8"
    convert_checkpoint(builtin_checkpoint("dense"), fp8, ConvertConfig(format="fp8", progress=False))
    cfg = TrainConfig.of(hf_checkpoint=str(fp8), ref_load=str(builtin_checkpoint("dense")), true_on_policy_mode=True,
                      num_rollout=1, rollout_batch_size=1, n_samples_per_prompt=2)
    with pytest.raises(QuantrollError, match="cannot hold in mode 1 \\(a fp8 --hf-checkpoint"):
        run_training(cfg, progress=False, log=lambda *_: None)

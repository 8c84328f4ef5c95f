"""Trainer policy loading, logprobs (equal to the engine's), FP32 master weights."""

import pytest
import torch

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.engine import Engine, SamplingParams
from quantroll.errors import QuantrollError
from quantroll.trainer.optimizer import MasterWeightAdamW
from quantroll.trainer.policy import load_policy, response_logprobs


def test_quantized_ref_load_is_refused_with_the_mode_1_explanation(tiny_qwen3_dir, tmp_path):
    fp8 = tmp_path / "fp8"
    convert_checkpoint(tiny_qwen3_dir, fp8, ConvertConfig(format="fp8", progress=False))
    with pytest.raises(QuantrollError, match=r"quantized \(fp8\) checkpoint; the trainer needs BF16.*--hf-checkpoint"):
        load_policy(fp8)


def test_trainer_logprobs_equal_engine_logprobs_in_float32(tiny_qwen3_dir):
    engine = Engine(tiny_qwen3_dir, dtype=torch.float32)
    policy = load_policy(tiny_qwen3_dir, dtype=torch.float32)
    prompts = [[5, 9, 17], [3, 1, 4, 1, 5, 9, 2, 6]]
    res = engine.generate(prompts, SamplingParams(temperature=0.8, max_new_tokens=7, seed=2))
    logp, mask = response_logprobs(policy, prompts, [r.tokens for r in res], temperature=0.8)
    for i, r in enumerate(res):
        n = len(r.tokens)
        assert mask[i].sum() == n
        assert torch.allclose(logp[i, :n].detach(), torch.tensor(r.logprobs), atol=2e-5)
    logp.sum().backward()
    assert policy.model.layers[0].mlp.down_proj.weight.grad is not None


def test_master_weights_keep_updates_too_small_for_bf16():
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = MasterWeightAdamW([p], lr=1e-4)
    for _ in range(50):  # each AdamW step moves 1e-4: below bf16's 2**-8 spacing at 1.0
        opt.zero_grad()
        p.grad = torch.ones_like(p)
        opt.step()
    assert abs(opt.master[0][0].item() - (1 - 50e-4)) < 1e-5
    assert p[0].item() == pytest.approx(1 - 50e-4, abs=2**-8)  # the rounded master, not stuck at 1.0
    assert p[0].item() < 1.0


def test_entropy_beside_the_logprobs_matches_a_float64_full_forward(tiny_qwen3_dir):
    """response_logprobs_and_entropy: the same logprobs as response_logprobs, and at each
    response position the entropy of softmax(logits / T) of a float64 full forward (the
    position before the token, so the last prompt position predicts the first token)."""
    from quantroll.trainer.policy import response_logprobs_and_entropy

    policy = load_policy(tiny_qwen3_dir, dtype=torch.float32)
    prompts, responses, t = [[5, 9, 17], [3, 1, 4, 1, 5, 9, 2, 6]], [[7, 8, 9, 10], [11, 12]], 0.7
    with torch.no_grad():
        logp, entropy, mask = response_logprobs_and_entropy(policy, prompts, responses, t, chunk_rows=3)
        plain, plain_mask = response_logprobs(policy, prompts, responses, t, chunk_rows=3)
        assert torch.equal(logp, plain) and torch.equal(mask, plain_mask)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            ids = torch.tensor([p + r[:-1]])
            logits = policy(ids)[0].double() / t
            ref = torch.log_softmax(logits, -1)[len(p) - 1:]
            want = -(ref.exp() * ref).sum(-1)
            assert torch.allclose(entropy[i, : len(r)].double(), want, atol=1e-4, rtol=1e-4)
            assert (entropy[i, len(r):] == 0).all()
        assert (entropy[mask.bool()] > 0).all()

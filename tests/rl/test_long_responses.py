"""Training on long responses: the trainer never holds the full-vocabulary logits of a whole
sequence (response_logprobs projects the response positions only, ``chunk_rows`` at a time,
each chunk recomputed in the backward pass), and ``--micro-batch-size`` splits a minibatch
into forward passes whose gradients accumulate. Both must change nothing but float32
rounding: checked here on a 2,000-token response of the built-in model (its context is
2,048 positions) against the unchunked computation, in float32 on the CPU."""

from __future__ import annotations

import random

import torch

from quantroll.builtin import builtin_checkpoint
from quantroll.engine import GenerationResult
from quantroll.rl.config import TrainConfig
from quantroll.rl.rollout import RolloutBatch
from quantroll.rl.step import train_on_batch
from quantroll.trainer.policy import load_policy, response_logprobs

LONG = 2000
TEMPERATURE = 0.8


def _sequences(vocab: int, lengths: list[int], seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(12, 40))] for _ in lengths]
    responses = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    return prompts, responses


def _whole_sequence_logprobs(policy, prompt: list[int], response: list[int]) -> torch.Tensor:
    """The unchunked computation: the model's logits at every position of the sequence, one
    log-softmax over the full vocabulary, the response tokens picked."""
    ids = torch.tensor([prompt + response])
    logits = policy(ids)[0, len(prompt) - 1: len(prompt) + len(response) - 1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_chunked_logprobs_and_their_gradients_equal_the_whole_sequence_computation():
    torch.manual_seed(0)
    policy = load_policy(builtin_checkpoint("dense"), dtype=torch.float32)
    prompts, responses = _sequences(policy.config.vocab_size, [LONG, 37])
    weight = policy.model.layers[1].mlp.down_proj.weight
    results = {}
    for label, chunk_rows in (("chunked", 300), ("one chunk", 10**6)):
        policy.zero_grad()
        logp, mask = response_logprobs(policy, prompts, responses, TEMPERATURE, chunk_rows=chunk_rows)
        (logp * mask).sum().backward()
        results[label] = (logp.detach().clone(), weight.grad.clone())
    policy.zero_grad()
    whole = [_whole_sequence_logprobs(policy, p, r) for p, r in zip(prompts, responses)]
    (sum(w.sum() for w in whole)).backward()
    logp, grad = results["chunked"]
    assert mask[0].sum() == LONG and mask[1].sum() == 37
    for i, w in enumerate(whole):
        assert torch.allclose(logp[i, : len(w)], w.detach(), rtol=0, atol=2e-5), i
        assert torch.equal(logp[i, len(w):], torch.zeros_like(logp[i, len(w):]))
    assert torch.allclose(logp, results["one chunk"][0], rtol=0, atol=2e-5)
    scale = weight.grad.abs().max()
    assert scale > 0
    assert (grad - weight.grad).abs().max() <= 1e-5 * scale
    assert (grad - results["one chunk"][1]).abs().max() <= 1e-5 * scale


def _step(micro_batch_size: int | None, batch: RolloutBatch):
    """(metrics, FP32 masters before, after) of one train_on_batch."""
    from quantroll.trainer.optimizer import MasterWeightAdamW

    torch.manual_seed(0)
    policy = load_policy(builtin_checkpoint("dense"), dtype=torch.float32)
    optimizer = MasterWeightAdamW(policy.parameters(), lr=5e-6)
    before = [m.detach().clone() for m in optimizer.export()[0]]
    cfg = TrainConfig.of(rollout_batch_size=2, n_samples_per_prompt=2, lr=5e-6, micro_batch_size=micro_batch_size,
                         use_tis=True)
    metrics = train_on_batch(cfg, policy, None, optimizer, batch)
    return metrics, before, [m.detach().clone() for m in optimizer.export()[0]]


def test_micro_batches_train_a_2k_token_response_like_one_forward_pass():
    """One RL step on 4 sequences (one of them 2,000 tokens): micro-batches of 1 sequence
    give the loss, gradient norm and updated FP32 masters of the whole minibatch at once."""
    vocab = load_policy(builtin_checkpoint("dense")).config.vocab_size
    prompts, responses = _sequences(vocab, [LONG, 15, 230, 3], seed=1)
    rng = random.Random(2)
    results = [GenerationResult(p, r, [-rng.random() * 2 for _ in r], "length", None, 0)
               for p, r in zip(prompts, responses)]
    batch = RolloutBatch(prompts, [""] * 4, results, torch.tensor([1.0, 0.0, 0.0, 1.0]), 0.0)
    whole, before, whole_masters = _step(None, batch)
    micro, _, micro_masters = _step(1, batch)
    assert abs(micro["loss"] - whole["loss"]) <= 1e-5 * abs(whole["loss"])
    assert abs(micro["grad_norm"] - whole["grad_norm"]) <= 1e-5 * whole["grad_norm"]
    assert sum(not torch.equal(a, b) for a, b in zip(before, whole_masters)) > len(before) // 2  # the step moved them
    # Adam divides each gradient by its own magnitude: an element whose gradient is at rounding level moves
    # by up to +-lr either way, so the weights are compared at 1e-5 of each tensor's scale (as across ranks)
    for i, (a, b, start) in enumerate(zip(micro_masters, whole_masters, before)):
        assert (a - b).abs().max() <= 1e-5 * float(start.abs().max()), i

"""Sampling: the reported logprob, truncation, reproducible seeds, the sampled law."""

import math

import pytest
import torch

from quantroll.engine.sampling import SamplingParams, gumbel_noise, reported_logprobs, sample, truncation_mask
from quantroll.errors import QuantrollError


def test_reported_logprob_is_full_vocab_log_softmax_at_temperature_before_truncation():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(temperature=0.5, top_k=1, seed=3)
    tok, lp = sample(logits, params, torch.tensor([3]), torch.tensor([0]))
    assert tok.item() == 0  # top-k 1 keeps only the best
    want = 4.0 - math.log(sum(math.exp(v / 0.5) for v in [2.0, 1.0, 0.0, -1.0]))
    assert lp.item() == pytest.approx(want, abs=1e-6)  # not 0.0, the truncated law's logprob


def test_greedy_reports_temperature_one():
    logits = torch.tensor([[0.5, 3.0, 1.0]])
    tok, lp = sample(logits, SamplingParams(temperature=0), torch.tensor([0]), torch.tensor([0]))
    assert tok.item() == 1
    assert lp.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 1].item(), abs=1e-7)


def test_truncation_by_hand():
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert truncation_mask(lp, 1.0, 2).tolist() == [[True, True, False, False]]
    assert truncation_mask(lp, 0.8, 0).tolist() == [[True, True, False, False]]  # 0.5 + 0.3 reaches 0.8
    assert truncation_mask(lp, 0.81, 0).tolist() == [[True, True, True, False]]
    assert truncation_mask(lp, 0.1, 0).tolist() == [[True, False, False, False]]  # best always kept


def test_seed_reproduces_independent_of_batch_neighbours():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g)
    p = SamplingParams(temperature=1.0)
    a, _ = sample(logits, p, torch.tensor([7, 8, 9, 10]), torch.tensor([5, 5, 5, 5]))
    b, _ = sample(logits[2:3], p, torch.tensor([9]), torch.tensor([5]))
    assert a[2] == b[0]
    assert not torch.equal(gumbel_noise(torch.tensor([1]), torch.tensor([5]), 50),
                           gumbel_noise(torch.tensor([1]), torch.tensor([6]), 50))


def test_sampled_frequencies_follow_the_truncated_law():
    # 20000 draws of one distribution (distinct seeds): chi-square against the truncated, renormalized law
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = torch.log(probs).expand(20000, 4)
    t = 1.0
    toks, _ = sample(logits, SamplingParams(temperature=t, top_p=0.85), torch.arange(20000), torch.zeros(20000, dtype=torch.long))
    counts = torch.bincount(toks, minlength=4).double()
    assert counts[3] == 0  # 0.4 + 0.3 + 0.2 = 0.9 >= 0.85: the last token is cut
    law = torch.tensor([0.4, 0.3, 0.2]) / 0.9
    expected = law * 20000
    chi2 = (((counts[:3] - expected) ** 2) / expected).sum().item()
    assert chi2 < 13.8  # 99.9% quantile of chi-square with 2 degrees of freedom


def test_temperature_sharpens():
    logits = torch.tensor([1.0, 0.0]).expand(20000, 2)
    seeds, pos = torch.arange(20000), torch.zeros(20000, dtype=torch.long)
    hot, _ = sample(logits, SamplingParams(temperature=2.0), seeds, pos)
    cold, _ = sample(logits, SamplingParams(temperature=0.25), seeds, pos)
    p_hot = 1 / (1 + math.exp(-0.5))
    p_cold = 1 / (1 + math.exp(-4.0))
    assert abs((hot == 0).double().mean().item() - p_hot) < 0.02
    assert abs((cold == 0).double().mean().item() - p_cold) < 0.02


@pytest.mark.parametrize("kw,message", [
    ({"temperature": -1}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"temperature": float("inf")}, "temperature must be a finite number"),
    ({"temperature": 1e-40}, "use temperature=0 for greedy"),
    ({"temperature": "0.5"}, "temperature must be a finite number"),
    ({"top_p": 0}, "top_p must be in"), ({"top_p": 1.5}, "top_p must be in"),
    ({"top_p": float("nan")}, "top_p must be in"),
    ({"top_k": -2}, "top_k must be an integer >= 0"), ({"top_k": 2.5}, "top_k must be an integer"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer"),
    ({"max_new_tokens": None}, "max_new_tokens must be an integer"),
    ({"seed": 1.5}, r"seed must be an integer in \[0, 2\^32\)"), ({"seed": -1}, "seed must be"),
    ({"seed": 2**32}, "seed must be"),
    ({"stop_token_ids": "eos"}, "stop_token_ids must be integers"), ({"stop_token_ids": (1, 2.0)}, "stop_token_ids"),
])
def test_bad_params_refused_in_one_line(kw, message):
    with pytest.raises(QuantrollError, match=message):
        SamplingParams(**kw)


def test_stop_ids_from_any_iterable_become_a_tuple():
    assert SamplingParams(stop_token_ids=[5, 3]).stop_token_ids == (5, 3)
    assert SamplingParams(stop_token_ids={7}).stop_token_ids == (7,)
    assert SamplingParams(temperature=1e-6).temperature == 1e-6  # the smallest accepted


def test_reported_logprobs_float32():
    assert reported_logprobs(torch.zeros(1, 3, dtype=torch.bfloat16), 1.0).dtype == torch.float32

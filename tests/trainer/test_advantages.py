"""GRPO and REINFORCE++ advantages: hand-computed cases, a float64 loop reference, and
the edges (equal rewards, empty masks, one token, bad group sizes).

Tolerance: float32 outputs of order 1 against hand values or the float64 reference,
rtol 1e-5 / atol 1e-6 (the statistics are computed in float64; only the final cast
rounds).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantroll.trainer.advantages import broadcast_to_tokens, grpo_advantages, reinforce_plus_plus_advantages

TOL = dict(rtol=1e-5, atol=1e-6)


def test_grpo_hand_cases():
    # group of 4: [1, 0, 0, 0], mean 0.25, deviations 0.75, -0.25 x3,
    # unbiased var = (0.5625 + 3 * 0.0625) / 3 = 0.25, std 0.5 -> 1.5, -0.5, -0.5, -0.5
    # group of 4: [2, 2, 2, 2] -> all 0 (nothing to prefer)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    adv = grpo_advantages(rewards, 4)
    # / (std + 1e-6): 0.75 / 0.500001 = 1.499997, -0.25 / 0.500001 = -0.499999
    torch.testing.assert_close(adv, torch.tensor([1.499997, -0.499999, -0.499999, -0.499999, 0, 0, 0, 0]), **TOL)
    assert adv.dtype == torch.float32
    # groups of 2: [3, 1] -> mean 2, std sqrt(2) -> +-1/sqrt(2)
    torch.testing.assert_close(grpo_advantages(torch.tensor([3.0, 1.0]), 2), torch.tensor([0.7071065, -0.7071065]), **TOL)


def test_grpo_without_std_normalization():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 3.0])
    # groups of 2: [1, 0] -> +-0.5; [0, 0] -> 0; [5, 3] -> +-1
    adv = grpo_advantages(rewards, 2, normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0, 0.0, 1.0, -1.0]), rtol=0, atol=0)


def test_grpo_groups_are_consecutive():
    # prompt 0 -> samples 0,1; prompt 1 -> samples 2,3 (not interleaved 0,2 / 1,3)
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), 2, normalize_std=False)
    assert adv.tolist() == [0.5, -0.5, 0.5, -0.5]


def _grpo_ref(rewards, n, normalize, eps):
    out = []
    r = rewards.double().tolist()
    for start in range(0, len(r), n):
        g = r[start : start + n]
        mean = sum(g) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (n - 1))
        out += [(x - mean) / (std + eps) if normalize else x - mean for x in g]
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("normalize", [True, False])
def test_grpo_matches_float64_reference(normalize):
    rewards = torch.randn(24, generator=torch.Generator().manual_seed(0))
    for n in (2, 3, 8):
        adv = grpo_advantages(rewards, n, normalize_std=normalize)
        torch.testing.assert_close(adv.double(), _grpo_ref(rewards, n, normalize, 1e-6), **TOL)


def test_grpo_rejects_bad_groups():
    with pytest.raises(ValueError, match="at least 2"):
        grpo_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(2, 2), 2)


def test_broadcast_to_tokens():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 1]])
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0, 0.5]), mask)
    assert out.tolist() == [[2.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.5]]


# ---------------------------------------------------------------- REINFORCE++

MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])


def test_reinforce_pp_hand_case():
    # returns per response token: 1, 1 | 0 | 0, 0, 0 | (sample 3 has no tokens)
    # n = 6, mean = 2/6 = 1/3; sum of squared deviations 2*(2/3)^2 + 4*(1/3)^2 = 4/3
    # unbiased var = (4/3)/5 = 4/15, std = 0.5163978
    # A = (2/3)/0.5163978 = 1.2909944 on reward-1 tokens, (-1/3)/0.5163978 = -0.6454972 on the rest
    adv = reinforce_plus_plus_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), MASK)
    a, b = 1.2909944, -0.6454972
    expected = torch.tensor([[a, a, 0], [b, 0, 0], [b, b, b], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, **TOL)
    assert adv.dtype == torch.float32


def test_reinforce_pp_baseline_form_hand_case():
    # groups of 2: [3, 1] -> [1, -1]; [2, 2] -> [0, 0]
    # tokens: 1, 1 | -1 | 0, 0, 0 -> n = 6, mean = 1/6
    # squared deviations: 2*(5/6)^2 + (7/6)^2 + 3*(1/6)^2 = (50 + 49 + 3)/36 = 102/36
    # unbiased var = (102/36)/5 = 0.5666667, std = 0.7527727
    # A: (5/6)/0.7527727 = 1.1070188; (-7/6)/0.7527727 = -1.5498263; (-1/6)/0.7527727 = -0.2214038
    adv = reinforce_plus_plus_advantages(torch.tensor([3.0, 1.0, 2.0, 2.0]), MASK, group_size=2)
    a, b, c = 1.1070188, -1.5498263, -0.2214038
    torch.testing.assert_close(adv, torch.tensor([[a, a, 0], [b, 0, 0], [c, c, c], [0, 0, 0]]), **TOL)


def _rpp_ref(rewards, mask, group_size, eps=1e-8):
    r = rewards.double().tolist()
    if group_size:
        r = [x - sum(r[i - i % group_size : i - i % group_size + group_size]) / group_size for i, x in enumerate(r)]
    tokens = [(b, t) for b, row in enumerate(mask.tolist()) for t, k in enumerate(row) if k]
    vals = [r[b] for b, _ in tokens]
    n = len(vals)
    mean = sum(vals) / n
    var = sum((v - mean) ** 2 for v in vals) / (n - 1 if n > 1 else 1)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b, t in tokens:
        out[b, t] = (r[b] - mean) / math.sqrt(var + eps)
    return out


@pytest.mark.parametrize("group_size", [None, 2, 4])
def test_reinforce_pp_matches_float64_reference(group_size):
    g = torch.Generator().manual_seed(2)
    rewards = torch.randn(8, generator=g)
    mask = torch.rand(8, 10, generator=g) < 0.7
    mask[5] = False
    adv = reinforce_plus_plus_advantages(rewards, mask, group_size=group_size)
    torch.testing.assert_close(adv.double(), _rpp_ref(rewards, mask, group_size), **TOL)


@settings(max_examples=40, deadline=None)
@given(
    rewards=st.lists(st.floats(-10, 10), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_reinforce_pp_whitened_over_tokens(rewards, seed):
    r = torch.tensor(rewards)
    mask = torch.rand(len(rewards), 6, generator=torch.Generator().manual_seed(seed)) < 0.6
    adv = reinforce_plus_plus_advantages(r, mask).double()
    assert torch.isfinite(adv).all()
    assert (adv[~mask] == 0).all()
    vals = adv[mask]
    if vals.numel() == 0:
        return
    assert abs(vals.mean().item()) < 1e-5
    returns = r.double()[:, None].expand_as(mask)[mask]
    spread = returns.var().item() if returns.numel() > 1 else 0.0
    if spread > 1e-2:  # clearly non-constant (eps = 1e-8 shifts var by < 1e-6): unit variance
        assert vals.var().item() == pytest.approx(1.0, rel=1e-4)


def test_reinforce_pp_edges():
    # no response tokens at all -> zeros, not NaN
    out = reinforce_plus_plus_advantages(torch.tensor([1.0, 2.0]), torch.zeros(2, 3))
    assert torch.equal(out, torch.zeros(2, 3))
    # equal returns -> zeros
    out = reinforce_plus_plus_advantages(torch.tensor([1.0, 1.0]), torch.ones(2, 3))
    assert torch.equal(out, torch.zeros(2, 3))
    # one token -> zeros (its own mean)
    out = reinforce_plus_plus_advantages(torch.tensor([5.0, 1.0]), torch.tensor([[0, 1], [0, 0]]))
    assert torch.equal(out, torch.zeros(2, 2))
    with pytest.raises(ValueError):
        reinforce_plus_plus_advantages(torch.zeros(3), torch.ones(2, 3))

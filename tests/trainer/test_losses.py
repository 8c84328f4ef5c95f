"""PPO surrogate, KL penalties and loss aggregation: hand-computed cases, a float64
loop reference on random inputs, gradients, and the edges (empty sequences, padding
garbage, runaway log-ratios).

Tolerances: hand cases built from float32 log-probs agree to 1e-6 absolute (one or two
float32 roundings of numbers of order 1); float32-vs-float64-reference comparisons use
rtol 1e-5 / atol 1e-6.
"""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from quantroll.trainer.losses import aggregate, kl_penalty, ppo_policy_loss

TOL = dict(rtol=1e-5, atol=1e-6)


def t32(rows):
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------- PPO surrogate


def test_ppo_hand_cases_symmetric_clip():
    # old_logp = 0, logp = log(ratio); eps = 0.2 -> clip range [0.8, 1.2]
    ratios = [1.5, 1.5, 0.5, 0.5, 1.1, 1.0]
    adv = [1.0, -1.0, 1.0, -1.0, 2.0, -3.0]
    logp = t32([[math.log(r) for r in ratios]])
    loss, clipped = ppo_policy_loss(logp, torch.zeros_like(logp), t32([adv]), eps_clip=0.2)
    # by hand, -min(r*A, clip(r)*A):
    #  r=1.5 A=+1: -min(1.5, 1.2)   = -1.2  clipped
    #  r=1.5 A=-1: -min(-1.5, -1.2) =  1.5  not clipped (pessimistic branch)
    #  r=0.5 A=+1: -min(0.5, 0.8)   = -0.5  not clipped
    #  r=0.5 A=-1: -min(-0.5, -0.8) =  0.8  clipped
    #  r=1.1 A=+2: -min(2.2, 2.2)   = -2.2  not clipped (inside the range)
    #  r=1.0 A=-3: 3.0                      not clipped
    torch.testing.assert_close(loss, t32([[-1.2, 1.5, -0.5, 0.8, -2.2, 3.0]]), rtol=0, atol=1e-6)
    assert clipped.tolist() == [[True, False, False, True, False, False]]
    assert clipped.dtype == torch.bool


def test_ppo_clip_higher():
    # r = 1.25, A = +1: eps=0.2 clips at 1.2; eps_high=0.28 lets 1.25 through
    logp = t32([[math.log(1.25)]])
    old, adv = torch.zeros_like(logp), t32([[1.0]])
    sym, sym_c = ppo_policy_loss(logp, old, adv, 0.2)
    asym, asym_c = ppo_policy_loss(logp, old, adv, 0.2, eps_clip_high=0.28)
    assert sym.item() == pytest.approx(-1.2, abs=1e-6) and sym_c.item()
    assert asym.item() == pytest.approx(-1.25, abs=1e-6) and not asym_c.item()
    # the low side still uses eps_clip: r = 0.7, A = -1 -> -min(-0.7, -0.8) = 0.8
    low, low_c = ppo_policy_loss(t32([[math.log(0.7)]]), old, -adv, 0.2, eps_clip_high=0.28)
    assert low.item() == pytest.approx(0.8, abs=1e-6) and low_c.item()


def _ppo_ref(logp, old, adv, eps, eps_high):
    loss, clipped = [], []
    for lp, lo, a in zip(logp.double().flatten().tolist(), old.double().flatten().tolist(), adv.double().flatten().tolist()):
        r = math.exp(max(-20.0, min(20.0, lp - lo)))
        unclipped, clip = -a * r, -a * min(max(r, 1 - eps), 1 + eps_high)
        loss.append(max(unclipped, clip))
        clipped.append(clip > unclipped)
    return torch.tensor(loss, dtype=torch.float64).view(logp.shape), torch.tensor(clipped).view(logp.shape)


@pytest.mark.parametrize("eps_high", [None, 0.28])
def test_ppo_matches_float64_reference(eps_high):
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(6, 9, generator=g) * 3
    old = logp + torch.randn(6, 9, generator=g) * 0.3
    adv = torch.randn(6, 9, generator=g)
    loss, clipped = ppo_policy_loss(logp, old, adv, 0.2, eps_high)
    ref, ref_clipped = _ppo_ref(logp, old, adv, 0.2, 0.2 if eps_high is None else eps_high)
    torch.testing.assert_close(loss.double(), ref, **TOL)
    assert torch.equal(clipped, ref_clipped)
    assert 0 < clipped.sum() < clipped.numel()  # the draw exercises both branches


def test_ppo_gradient_is_zero_exactly_where_clipped():
    ratios = [1.5, 0.5, 1.1]
    adv = t32([[1.0, 1.0, 2.0]])
    logp = t32([[math.log(r) for r in ratios]]).requires_grad_(True)
    loss, clipped = ppo_policy_loss(logp, torch.zeros_like(logp), adv, 0.2)
    loss.sum().backward()
    # d/dlogp of -A*r is -A*r where unclipped; 0 where clipped (1.5 with A>0)
    torch.testing.assert_close(logp.grad, t32([[0.0, -0.5, -2.2]]), rtol=0, atol=1e-6)
    assert clipped.tolist() == [[True, False, False]]


def test_ppo_runaway_log_ratio_stays_finite():
    logp, old = t32([[0.0, 0.0]]), t32([[-200.0, 200.0]])
    loss, _ = ppo_policy_loss(logp.requires_grad_(True), old, t32([[-1.0, 1.0]]), 0.2)
    # r clamped to exp(20) (A<0: loss -A*r = exp(20)) and exp(-20) (A>0: -min(r, 0.8) = -exp(-20))
    assert loss[0, 0].item() == pytest.approx(math.exp(20), rel=1e-6)
    assert loss[0, 1].item() == pytest.approx(-math.exp(-20), rel=1e-6)
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_ppo_rejects_bad_input():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        ppo_policy_loss(x, x, torch.zeros(2, 4), 0.2)
    with pytest.raises(ValueError):
        ppo_policy_loss(x, x, x, 1.5)


# ---------------------------------------------------------------- KL penalties


def test_kl_hand_cases():
    # logp -1.0, ref -1.2 -> d = 0.2
    logp, ref = t32([[-1.0]]), t32([[-1.2]])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.2, abs=1e-6)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.02, abs=1e-6)
    # k3 = exp(-0.2) + 0.2 - 1 = 0.8187307531 - 0.8 = 0.0187307531
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.0187307531, abs=1e-6)
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(0.0187307531, abs=1e-6)


def test_k3_unclamped_low_var_kl_clamped_like_verl():
    # d = logp - ref = -30: k3 = exp(30) - 30 - 1 = 1.0686474581e13; low_var_kl -> 10
    # d = +30: k3 = exp(-30) + 29 ~ 29; low_var_kl: kl=-30 -> -20 -> exp(-20)+19 -> 10
    logp, ref = t32([[-31.0, -1.0]]), t32([[-1.0, -31.0]])
    k3 = kl_penalty(logp, ref, "k3")
    assert k3[0, 0].item() == pytest.approx(1.0686474581e13, rel=1e-5)
    assert k3[0, 1].item() == pytest.approx(29.0, abs=1e-5)
    assert kl_penalty(logp, ref, "low_var_kl").tolist() == [[10.0, 10.0]]


def test_low_var_kl_gradient_finite_past_exp_overflow():
    # d = -100 overflows exp in float32 without the inner clamp (0 * inf = NaN in backward)
    logp = t32([[-101.0, -1.0]]).requires_grad_(True)
    ref = t32([[-1.0, -1.5]])
    kl_penalty(logp, ref, "low_var_kl").sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 0].item() == 0.0  # past the clamp: no gradient
    # inside: d/dlogp [exp(ref-logp) - (ref-logp) - 1] = 1 - exp(ref-logp) = 1 - exp(-0.5)
    assert logp.grad[0, 1].item() == pytest.approx(1 - math.exp(-0.5), abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(d=st.lists(st.floats(-25, 25), min_size=1, max_size=12))
@example(d=[-5.960464477539063e-08])  # exp(-d) rounds to 1 in float32: the literal formula gave -6e-8
def test_k2_k3_nonnegative_and_match_float64(d):
    logp = torch.tensor([d], dtype=torch.float32)
    ref = torch.zeros_like(logp)
    k3 = kl_penalty(logp, ref, "k3")
    assert (k3 >= 0).all() and (kl_penalty(logp, ref, "k2") >= 0).all()
    ref_k3 = torch.tensor([[math.exp(-x) + x - 1 for x in logp.double().flatten().tolist()]], dtype=torch.float64)
    # float32 exp and the cancellation in exp(-d) + d - 1 near d = 0: absolute 1e-6
    torch.testing.assert_close(k3.double(), ref_k3, rtol=1e-5, atol=1e-6)


def test_kl_unknown_kind():
    with pytest.raises(ValueError):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


# ---------------------------------------------------------------- aggregation

LOSS = t32([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_aggregate_hand_cases():
    # token-mean: (1 + 2 + 4) / 3
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(7 / 3, abs=1e-6)
    # seq-mean-token-mean: ((1 + 2)/2 + 4/1) / 2 = (1.5 + 4) / 2
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75, abs=1e-6)
    # numerator drops (0,1); denominator keeps the original counts
    num = torch.tensor([[1, 0, 0], [1, 0, 0]])
    assert aggregate(LOSS, num, "token-mean", denom_mask=MASK).item() == pytest.approx(5 / 3, abs=1e-6)
    # (1/2 + 4/1) / 2
    assert aggregate(LOSS, num, "seq-mean-token-mean", denom_mask=MASK).item() == pytest.approx(2.25, abs=1e-6)
    # bool and float masks agree
    assert aggregate(LOSS, MASK.bool()).item() == aggregate(LOSS, MASK.float()).item()


def test_seq_mean_skips_empty_sequences():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # only sequence 0 counts: (1 + 2) / 2 = 1.5 (not (1.5 + 0) / 2)
    assert aggregate(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx(1.5, abs=1e-6)


def test_empty_mask_gives_attached_zero():
    loss = LOSS.clone().requires_grad_(True)
    for mode in ("token-mean", "seq-mean-token-mean"):
        out = aggregate(loss, torch.zeros_like(MASK), mode)
        assert out.item() == 0.0
        out.backward()
        assert torch.equal(loss.grad, torch.zeros_like(loss))
        loss.grad = None


def test_padding_garbage_never_leaks():
    dirty = LOSS.clone()
    dirty[0, 2], dirty[1, 1], dirty[1, 2] = float("nan"), float("inf"), -float("inf")
    dirty.requires_grad_(True)
    for mode in ("token-mean", "seq-mean-token-mean"):
        out = aggregate(dirty, MASK, mode)
        assert out.item() == aggregate(LOSS, MASK, mode).item()
        out.backward()
        assert torch.isfinite(dirty.grad).all()
        dirty.grad = None


def _agg_ref(loss, num, den, mode):
    rows = [
        ([x for x, k in zip(lr, nr) if k], sum(1 for k in dr if k))
        for lr, nr, dr in zip(loss.double().tolist(), num.tolist(), den.tolist())
    ]
    if mode == "token-mean":
        total = sum(d for _, d in rows)
        return sum(sum(v) for v, _ in rows) / total if total else 0.0
    per_seq = [sum(v) / d for v, d in rows if d]
    return sum(per_seq) / len(per_seq) if per_seq else 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_aggregate_matches_float64_reference(mode):
    g = torch.Generator().manual_seed(1)
    loss = torch.randn(7, 11, generator=g)
    den = torch.rand(7, 11, generator=g) < 0.6
    den[3] = False  # one empty sequence
    num = den & (torch.rand(7, 11, generator=g) < 0.7)
    assert aggregate(loss, num, mode, denom_mask=den).item() == pytest.approx(_agg_ref(loss, num, den, mode), rel=1e-5, abs=1e-6)


def test_aggregate_unknown_mode():
    with pytest.raises(ValueError):
        aggregate(LOSS, MASK, "sum")

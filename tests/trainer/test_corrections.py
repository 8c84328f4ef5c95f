"""TIS / mask-mode corrections at token, sequence and geometric level.

Hand cases use log-ratios whose exponentials are known (ln 3 -> 3); the boundary cases
use r = 0 (ratio exactly 1) with bounds of exactly 1 so that inclusivity is tested
without rounding. Random inputs are compared with a float64 loop reference.

Tolerances: weights and metrics built from float32 log-probs agree with hand values to
rel 1e-5 (the float32 rounding of ln 3 etc. moves exp by ~1e-7 relative); the float64
reference on the same float32 inputs agrees to 1e-12 for metrics (same float64 math)
and to float32 rounding (rel 1e-6) for the corrected loss.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantroll.trainer.corrections import CorrectionConfig, correct
from quantroll.trainer.losses import aggregate

LN2, LN3, LN4 = math.log(2), math.log(3), math.log(4)


def cfg(mode="truncate", level="token", **kw):
    return CorrectionConfig(enabled=True, mode=mode, level=level, **kw)


def logps(ratios_log, pad=0.0):
    """rollout_logp = -1 everywhere, train_logp = -1 + r; padding (None) gets `pad`."""
    train = [[pad if r is None else -1.0 + r for r in row] for row in ratios_log]
    roll = [[pad if r is None else -1.0 for r in row] for row in ratios_log]
    mask = [[r is not None for r in row] for row in ratios_log]
    return torch.tensor(train), torch.tensor(roll), torch.tensor(mask)


# ---------------------------------------------------------------- config


def test_config_defaults_depend_on_mode_unless_given():
    assert CorrectionConfig().bounds == (0.0, 2.0)
    assert CorrectionConfig(mode="mask").bounds == (0.5, 5.0)
    assert CorrectionConfig(mode="mask", clip=3.0).bounds == (0.5, 3.0)
    assert CorrectionConfig(mode="truncate", clip_low=0.1).bounds == (0.1, 2.0)
    assert CorrectionConfig(mode="mask", clip=2.0, clip_low=0.0).bounds == (0.0, 2.0)
    with pytest.raises(Exception):
        CorrectionConfig().clip = 3.0  # frozen
    for bad in (dict(mode="clip"), dict(level="batch"), dict(clip=1.0, clip_low=2.0), dict(clip_low=-1.0), dict(clip=0.0)):
        with pytest.raises(ValueError):
            CorrectionConfig(**bad)


def test_disabled_returns_inputs_unchanged():
    train, roll, mask = logps([[LN3, 0.0, None]])
    loss = torch.randn(1, 3)
    out, m, metrics = correct(loss, train, roll, mask, CorrectionConfig(enabled=False, mode="mask"))
    assert out is loss and m is mask and metrics == {}


# ---------------------------------------------------------------- token level


def test_token_truncate_hand_case():
    # ratios 3, 1, 0.25 (and padding); truncate to [0, 2] -> weights 2, 1, 0.25
    train, roll, mask = logps([[LN3, 0.0, -LN4, None]])
    loss = torch.tensor([[1.0, -2.0, 4.0, 7.0]])
    out, m, metrics = correct(loss, train, roll, mask, cfg())
    torch.testing.assert_close(out, torch.tensor([[2.0, -2.0, 1.0, 7.0]]), rtol=1e-5, atol=0)
    assert m is mask
    # tis = (3 + 1 + 0.25)/3 = 1.4166667; clipfrac = 1/3 (only 3 > 2)
    # tis_abs = (2 + 0 + 0.75)/3 = 0.9166667
    # ess = (2 + 1 + 0.25)^2 / (3 * (4 + 1 + 0.0625)) = 10.5625 / 15.1875 = 0.6954733
    assert metrics["tis"] == pytest.approx(1.4166667, rel=1e-5)
    assert metrics["tis_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["tis_abs"] == pytest.approx(0.9166667, rel=1e-5)
    assert metrics["ess_ratio"] == pytest.approx(0.6954733, rel=1e-5)
    assert metrics["masked_fraction"] == 0.0 and metrics["tis_count"] == 3


def test_token_mask_hand_case_and_denominator():
    # default mask bounds [0.5, 5]: ratios 3, 1 kept (times the ratio), 0.25 dropped
    train, roll, mask = logps([[LN3, 0.0, -LN4, None]])
    loss = torch.ones(1, 4)
    out, m, metrics = correct(loss, train, roll, mask, cfg("mask"))
    torch.testing.assert_close(out, torch.tensor([[3.0, 1.0, 0.0, 1.0]]), rtol=1e-5, atol=0)
    assert m.tolist() == [[True, True, False, False]]
    # numerator 3 + 1, denominator keeps the original 3 tokens
    assert aggregate(out, m, "token-mean", denom_mask=mask).item() == pytest.approx(4 / 3, rel=1e-5)
    # weights 3, 1, 0: ess = 16 / (3 * 10) = 0.5333333
    assert metrics["ess_ratio"] == pytest.approx(16 / 30, rel=1e-5)
    assert metrics["tis_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["masked_fraction"] == pytest.approx(1 / 3)
    assert metrics["tis"] == pytest.approx(4.25 / 3, rel=1e-5)


def test_float_mask_keeps_its_dtype():
    train, roll, mask = logps([[LN3, -LN4]])
    _, m, _ = correct(torch.ones(1, 2), train, roll, mask.float(), cfg("mask"))
    assert m.dtype == torch.float32 and m.tolist() == [[1.0, 0.0]]


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_bounds_are_inclusive(mode):
    # r = 0 -> ratio exactly 1; with c = C = 1 it sits on both bounds: kept, not clamped
    # r = +-ln 2 -> ratio 2 / 0.5: outside [1, 1]
    train, roll, mask = logps([[0.0, LN2, -LN2, 0.0]])
    out, m, metrics = correct(torch.ones(1, 4), train, roll, mask, cfg(mode, clip=1.0, clip_low=1.0))
    assert metrics["tis_clipfrac"] == pytest.approx(0.5)
    assert out[0, 0].item() == 1.0 and out[0, 3].item() == 1.0
    if mode == "mask":
        assert m.tolist() == [[True, False, False, True]]
        assert out[0, 1].item() == 0.0 and out[0, 2].item() == 0.0
    else:
        assert out.tolist() == [[1.0, 1.0, 1.0, 1.0]]


# ---------------------------------------------------------------- sequence / geometric


def test_sequence_level_hand_case():
    # seq 0: r = ln 2, ln 3 -> product 6; seq 1: r = -ln 2 -> 0.5; seq 2: no tokens
    train, roll, mask = logps([[LN2, LN3], [-LN2, None], [None, None]])
    loss = torch.ones(3, 2)
    out, m, metrics = correct(loss, train, roll, mask, cfg(level="sequence"))
    # truncate [0, 2]: seq 0 -> 2 on both tokens, seq 1 -> 0.5
    torch.testing.assert_close(out, torch.tensor([[2.0, 2.0], [0.5, 1.0], [1.0, 1.0]]), rtol=1e-5, atol=0)
    # units are the 2 sequences with tokens: tis = (6 + 0.5)/2, clipfrac 1/2, tis_abs (5 + 0.5)/2
    assert metrics["tis"] == pytest.approx(3.25, rel=1e-5)
    assert metrics["tis_clipfrac"] == pytest.approx(0.5)
    assert metrics["tis_abs"] == pytest.approx(2.75, rel=1e-5)
    # ess over sequences: (2 + 0.5)^2 / (2 * (4 + 0.25)) = 6.25 / 8.5
    assert metrics["ess_ratio"] == pytest.approx(6.25 / 8.5, rel=1e-5)
    assert metrics["tis_count"] == 2

    # mask [0.5, 5]: seq 0 (6) leaves the numerator whole; seq 1 (0.5, on the bound) kept
    out, m, metrics = correct(loss, train, roll, mask, cfg("mask", level="sequence", clip_low=0.25))
    assert m.tolist() == [[False, False], [True, False], [False, False]]
    torch.testing.assert_close(out[1, 0], torch.tensor(0.5), rtol=1e-5, atol=0)
    assert out[0].tolist() == [0.0, 0.0]
    assert metrics["masked_fraction"] == pytest.approx(2 / 3)  # 2 of 3 response tokens
    assert metrics["tis_clipfrac"] == pytest.approx(0.5)  # 1 of 2 sequences


def test_geometric_level_hand_case():
    # seq 0: r = ln 2, ln 8 -> mean ln 4 -> ratio 4 -> truncated to 2; seq 1: r = ln 3 -> 3 -> 2
    train, roll, mask = logps([[LN2, 3 * LN2], [LN3, None]])
    out, _, metrics = correct(torch.ones(2, 2), train, roll, mask, cfg(level="geometric"))
    torch.testing.assert_close(out, torch.tensor([[2.0, 2.0], [2.0, 1.0]]), rtol=1e-5, atol=0)
    assert metrics["tis"] == pytest.approx(3.5, rel=1e-5)
    assert metrics["tis_clipfrac"] == 1.0


def test_log_ratio_clamp_at_20_applies_to_the_aggregate():
    # token: r = 30 -> exp(20), finite
    train, roll, mask = logps([[30.0]])
    _, _, metrics = correct(torch.ones(1, 1), train, roll, mask, cfg())
    assert metrics["tis"] == pytest.approx(math.exp(20), rel=1e-6)
    # sequence: r = 15, 15 -> sum 30 -> clamp 20 (clamping each token first would give exp(30))
    train, roll, mask = logps([[15.0, 15.0]])
    _, _, metrics = correct(torch.ones(1, 2), train, roll, mask, cfg(level="sequence"))
    assert metrics["tis"] == pytest.approx(math.exp(20), rel=1e-6)
    # geometric: r = 30, 0 -> mean 15 -> exp(15) (clamping tokens first would give exp(10))
    train, roll, mask = logps([[30.0, 0.0]])
    _, _, metrics = correct(torch.ones(1, 2), train, roll, mask, cfg(level="geometric"))
    assert metrics["tis"] == pytest.approx(math.exp(15), rel=1e-6)


# ---------------------------------------------------------------- gradients, garbage, empty


@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_weights_are_detached(mode, level):
    g = torch.Generator().manual_seed(3)
    train = (-torch.rand(3, 4, generator=g)).requires_grad_(True)
    roll = -torch.rand(3, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    loss = torch.randn(3, 4, generator=g).requires_grad_(True)
    out, m, _ = correct(loss, train, roll, mask, cfg(mode, level))
    aggregate(out, m, "token-mean", denom_mask=mask).backward()
    assert train.grad is None  # no gradient reaches the log-probs through the weight
    # d(sum(out * m) / n)/d loss = weight * m / n: recover the weight from the output
    weight = torch.where(loss.detach() != 0, out.detach() / loss.detach(), torch.zeros(()))
    torch.testing.assert_close(loss.grad, weight * m / mask.sum(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_padding_garbage_is_never_read(mode, level):
    clean = logps([[LN3, 0.0, None], [-LN4, None, None]], pad=0.0)
    dirty = logps([[LN3, 0.0, None], [-LN4, None, None]], pad=-float("inf"))
    loss = torch.ones(2, 3)
    a = correct(loss, *clean, cfg(mode, level))
    b = correct(loss, *dirty, cfg(mode, level))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]
    nan_train = clean[0].clone()
    nan_train[0, 2] = float("nan")
    c = correct(loss, nan_train, clean[1], clean[2], cfg(mode, level))
    assert torch.equal(a[0], c[0]) and a[2] == c[2]


def test_empty_mask_gives_zero_metrics_and_count():
    train, roll, mask = logps([[None, None]])
    for mode in ("truncate", "mask"):
        for level in ("token", "sequence", "geometric"):
            out, m, metrics = correct(torch.ones(1, 2), train, roll, mask, cfg(mode, level))
            assert out.tolist() == [[1.0, 1.0]]
            assert metrics == {
                "tis": 0.0, "tis_clipfrac": 0.0, "tis_abs": 0.0, "ess_ratio": 0.0,
                "masked_fraction": 0.0, "tis_ratio_min": 1.0, "tis_ratio_max": 1.0, "tis_count": 0,
            }


# ---------------------------------------------------------------- float64 reference


def _reference(loss, train, roll, mask, mode, level, c, C):
    """Loop over sequences in float64; returns (out, keep, metrics)."""
    L, tr, ro, mk = loss.double().tolist(), train.double().tolist(), roll.double().tolist(), mask.tolist()
    clamp = lambda x: max(-20.0, min(20.0, x))
    out = [row[:] for row in L]
    keep = [[bool(k) for k in row] for row in mk]
    ratios, weights, outside = [], [], []
    for b, row in enumerate(mk):
        idx = [t for t, k in enumerate(row) if k]
        if not idx:
            continue
        rs = [tr[b][t] - ro[b][t] for t in idx]
        if level == "token":
            groups = [([t], math.exp(clamp(r))) for t, r in zip(idx, rs)]
        else:
            agg = sum(rs) if level == "sequence" else sum(rs) / len(rs)
            groups = [(idx, math.exp(clamp(agg)))]
        for toks, ratio in groups:
            out_of = not (c <= ratio <= C)
            if mode == "truncate":
                w = min(max(ratio, c), C)
            else:
                w = 0.0 if out_of else ratio
            for t in toks:
                out[b][t] = L[b][t] * w
                if mode == "mask" and out_of:
                    keep[b][t] = False
            ratios.append(ratio)
            weights.append(w)
            outside.append(out_of)
    n, n_tok = len(ratios), sum(map(sum, mk))
    dropped = sum(1 for b, row in enumerate(mk) for t, k in enumerate(row) if k and not keep[b][t])
    sw2 = sum(w * w for w in weights)
    metrics = {
        "tis": sum(ratios) / n,
        "tis_clipfrac": sum(outside) / n,
        "tis_abs": sum(abs(r - 1) for r in ratios) / n,
        "ess_ratio": sum(weights) ** 2 / (n * sw2) if sw2 else 0.0,
        "masked_fraction": dropped / n_tok,
        "tis_ratio_min": min(ratios),
        "tis_ratio_max": max(ratios),
        "tis_count": n,
    }
    return torch.tensor(out, dtype=torch.float64), torch.tensor(keep), metrics


@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_matches_float64_reference(mode, level):
    g = torch.Generator().manual_seed(4)
    B, T = 9, 12
    roll = -torch.rand(B, T, generator=g) * 4
    # a per-sequence offset so that tokens, sums and means all straddle both bounds
    offset = torch.linspace(-1.5, 1.5, B)[:, None] / (8 if level == "sequence" else 1)
    train = roll + offset + torch.randn(B, T, generator=g) * 0.3
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[2] = False
    loss = torch.randn(B, T, generator=g)
    config = cfg(mode, level)
    out, m, metrics = correct(loss, train, roll, mask, config)
    ref_out, ref_keep, ref_metrics = _reference(loss, train, roll, mask, mode, level, *config.bounds)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-6, atol=1e-7)
    if mode == "mask":
        assert torch.equal(m, ref_keep & mask)
    assert metrics.keys() == ref_metrics.keys()
    for k, v in ref_metrics.items():
        assert metrics[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k
    assert 0 < metrics["tis_clipfrac"] < 1  # the draw exercises both sides of the bounds


# ---------------------------------------------------------------- properties


@st.composite
def batches(draw):
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    r = draw(st.lists(st.floats(-25, 25), min_size=B * T, max_size=B * T))
    keep = draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))
    train = torch.tensor(r, dtype=torch.float32).view(B, T) - 1.0
    roll = torch.full((B, T), -1.0)
    return train, roll, torch.tensor(keep).view(B, T)


@settings(max_examples=60, deadline=None)
@given(
    batch=batches(),
    mode=st.sampled_from(["truncate", "mask"]),
    level=st.sampled_from(["token", "sequence", "geometric"]),
    bounds=st.tuples(st.floats(0, 3), st.floats(0.01, 10)).filter(lambda b: b[0] <= b[1]),
)
def test_properties(batch, mode, level, bounds):
    train, roll, mask = batch
    c, C = bounds
    out, m, metrics = correct(torch.ones_like(train), train, roll, mask, cfg(mode, level, clip_low=c, clip=C))
    w = out[mask.bool()].double()
    assert torch.isfinite(out).all()
    tol = 1e-6 * C  # float32 cast of the weight
    if mode == "truncate":
        assert ((w >= c - tol) & (w <= C + tol)).all()
    else:
        kept = out[m.bool()].double()
        assert ((kept >= c - tol) & (kept <= C + tol)).all()
        assert (out[mask.bool() & ~m.bool()] == 0).all()
    for k in ("tis_clipfrac", "masked_fraction"):
        assert 0.0 <= metrics[k] <= 1.0
    if metrics["tis_count"] and (w != 0).any():
        assert 0.0 < metrics["ess_ratio"] <= 1.0 + 1e-12
    else:
        assert metrics["ess_ratio"] == 0.0

"""Mismatch metrics and routing agreement: a hand-computed batch, the KL direction on
exact distributions, a float64 loop reference, and the edges (empty mask, padding
garbage, runaway log-ratios).

Tolerances: the metrics are computed in float64 from float32 log-probs, so against the
float64 reference (same float32 inputs) they agree to 1e-12 relative; against hand
values written to 7 significant digits, rel 1e-6.
"""

import math

import numpy as np
import pytest
import torch

from quantroll.metrics.mismatch import METRIC_NAMES, mismatch_metrics, routing_agreement

NAN = float("nan")


def batch(train_rows, roll_rows):
    """None = padding (mask 0, value NaN so that any read of it shows)."""
    mask = torch.tensor([[x is not None for x in row] for row in train_rows])
    fill = lambda rows: torch.tensor([[NAN if x is None else x for x in row] for row in rows])
    return fill(train_rows), fill(roll_rows), mask


def test_hand_case():
    # train [[-1, -2, pad], [-0.5, pad, pad]], rollout [[-1.5, -1, pad], [-0.5, pad, pad]]
    # r = 0.5, -1, 0 (3 tokens; 2 sequences)
    train, roll, mask = batch([[-1.0, -2.0, None], [-0.5, None, None]], [[-1.5, -1.0, None], [-0.5, None, None]])
    m = mismatch_metrics(train, roll, mask)
    # |r|: (0.5 + 1 + 0)/3
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx(0.5, rel=1e-12)
    # k3: (e^0.5 - 1.5) + (e^-1 - 1 + 1) + 0 = 0.1487213 + 0.3678794 = 0.5166007 / 3
    assert m["train_rollout_kl"] == pytest.approx(0.1722002, rel=1e-6)
    # log ppl diff per seq = -mean(r): seq0 -(0.5 - 1)/2 = 0.25, seq1 0 -> 0.125
    assert m["log_ppl_diff"] == pytest.approx(0.125, rel=1e-12)
    # ppl ratio: (e^0.25 + 1)/2 = (1.2840254 + 1)/2
    assert m["ppl_ratio"] == pytest.approx(1.1420127, rel=1e-6)
    # chi2_token: (e^1 + e^-2 + e^0)/3 - 1 = (2.7182818 + 0.1353353 + 1)/3 - 1
    assert m["chi2_token"] == pytest.approx(0.2845390, rel=1e-6)
    # chi2_seq: sums -0.5, 0 -> (e^-1 + e^0)/2 - 1
    assert m["chi2_seq"] == pytest.approx(-0.3160603, rel=1e-6)
    # p: train e^-1, e^-2, e^-0.5; rollout e^-1.5, e^-1, e^-0.5
    # |dp|: 0.3678794 - 0.2231302 = 0.1447493; |0.1353353 - 0.3678794| = 0.2325442; 0
    assert m["train_rollout_prob_abs_diff_max"] == pytest.approx(0.2325442, rel=1e-6)
    assert m["train_rollout_prob_abs_diff_mean"] == pytest.approx((0.1447493 + 0.2325442) / 3, rel=1e-6)
    pt, pr = np.exp([-1.0, -2.0, -0.5]), np.exp([-1.5, -1.0, -0.5])
    assert m["train_rollout_prob_pearson"] == pytest.approx(np.corrcoef(pt, pr)[0, 1], rel=1e-9)
    assert m["mismatch_tokens"] == 3 and m["mismatch_seqs"] == 2
    assert all(type(m[k]) is float for k in METRIC_NAMES)


def test_identical_policies():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 6, generator=g) * 3
    m = mismatch_metrics(lp, lp.clone(), torch.ones(4, 6))
    for k in ("train_rollout_logprob_abs_diff", "train_rollout_kl", "log_ppl_diff", "chi2_token", "chi2_seq",
              "train_rollout_prob_abs_diff_max", "train_rollout_prob_abs_diff_mean"):
        assert m[k] == 0.0, k
    assert m["ppl_ratio"] == 1.0
    assert m["train_rollout_prob_pearson"] == pytest.approx(1.0, abs=1e-12)


def test_kl_is_rollout_to_train():
    # q (rollout) = [1/2, 1/4, 1/4], p (train) = [3/4, 1/8, 1/8]. Tokens drawn from q in
    # exact proportions (a, a, b, c), so the token mean is the exact E_q.
    # KL(q||p) = 1/2 ln(2/3) + 2 * 1/4 ln 2 = 0.1438410
    # KL(p||q) = 3/4 ln(3/2) + 2 * 1/8 ln(1/2) = 0.1308120 (the other direction differs)
    q, p = [0.5, 0.5, 0.25, 0.25], [0.75, 0.75, 0.125, 0.125]
    train = torch.tensor([[math.log(x) for x in p]])
    roll = torch.tensor([[math.log(x) for x in q]])
    kl = mismatch_metrics(train, roll, torch.ones(1, 4))["train_rollout_kl"]
    assert kl == pytest.approx(0.1438410, rel=1e-6)
    assert abs(kl - 0.1308120) > 1e-2


def test_empty_mask_is_nan_free():
    train, roll, mask = batch([[None, None]], [[None, None]])
    m = mismatch_metrics(train, roll, mask)
    assert m == {**dict.fromkeys(METRIC_NAMES, 0.0), "mismatch_tokens": 0, "mismatch_seqs": 0}


def test_padding_and_empty_sequences_are_ignored():
    clean = batch([[-1.0, -2.0], [-0.5, -0.7]], [[-1.5, -1.0], [-0.5, -0.9]])
    with_pad = batch(
        [[-1.0, -2.0, None], [None, None, None], [-0.5, -0.7, None]],
        [[-1.5, -1.0, None], [None, None, None], [-0.5, -0.9, None]],
    )
    with_pad[0][1, 0] = -float("inf")  # even -inf in padding is never read
    assert mismatch_metrics(*clean) == mismatch_metrics(*with_pad)


def test_runaway_log_ratios_clamped_at_20():
    # one token r = 30: chi2_token = e^(2*20) - 1, finite; abs diff stays raw (30)
    m = mismatch_metrics(torch.tensor([[29.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1))
    assert m["chi2_token"] == pytest.approx(math.exp(40) - 1, rel=1e-12)
    assert m["train_rollout_logprob_abs_diff"] == 30.0
    # chi2_seq clamps the sequence sum (15 + 15 = 30 -> 20), not the tokens
    m = mismatch_metrics(torch.tensor([[14.0, 14.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2))
    assert m["chi2_seq"] == pytest.approx(math.exp(40) - 1, rel=1e-12)
    assert m["chi2_token"] == pytest.approx(math.exp(30) - 1, rel=1e-12)
    assert all(math.isfinite(v) for v in m.values())


def test_pearson_undefined_cases():
    # one token: no variance -> 1.0 when equal, 0.0 otherwise
    same = mismatch_metrics(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1))
    diff = mismatch_metrics(torch.tensor([[-1.0]]), torch.tensor([[-2.0]]), torch.ones(1, 1))
    assert same["train_rollout_prob_pearson"] == 1.0 and diff["train_rollout_prob_pearson"] == 0.0


def _reference(train, roll, mask):
    tr, ro, mk = train.double().tolist(), roll.double().tolist(), mask.tolist()
    clamp = lambda x: max(-20.0, min(20.0, x))
    toks, seqs = [], []
    for b, row in enumerate(mk):
        pairs = [(tr[b][t], ro[b][t]) for t, k in enumerate(row) if k]
        toks += pairs
        if pairs:
            lt = sum(a for a, _ in pairs) / len(pairs)
            lr = sum(c for _, c in pairs) / len(pairs)
            seqs.append(((-lt) - (-lr), sum(a - c for a, c in pairs)))
    rs = [a - c for a, c in toks]
    n, s = len(rs), len(seqs)
    pt, pr = np.exp([a for a, _ in toks]), np.exp([c for _, c in toks])
    return {
        "train_rollout_logprob_abs_diff": sum(abs(r) for r in rs) / n,
        "train_rollout_kl": sum(math.exp(clamp(r)) - 1 - r for r in rs) / n,
        "log_ppl_diff": sum(d for d, _ in seqs) / s,
        "ppl_ratio": sum(math.exp(clamp(d)) for d, _ in seqs) / s,
        "chi2_token": sum(math.exp(2 * clamp(r)) for r in rs) / n - 1,
        "chi2_seq": sum(math.exp(2 * clamp(S)) for _, S in seqs) / s - 1,
        "train_rollout_prob_abs_diff_max": float(np.abs(pt - pr).max()),
        "train_rollout_prob_abs_diff_mean": float(np.abs(pt - pr).mean()),
        "train_rollout_prob_pearson": float(np.corrcoef(pt, pr)[0, 1]),
        "mismatch_tokens": n,
        "mismatch_seqs": s,
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_float64_reference(seed):
    g = torch.Generator().manual_seed(seed)
    roll = -torch.rand(7, 13, generator=g) * 5
    train = roll + torch.randn(7, 13, generator=g) * 0.2
    mask = torch.rand(7, 13, generator=g) < 0.6
    mask[4] = False
    got, ref = mismatch_metrics(train, roll, mask), _reference(train, roll, mask)
    assert got.keys() == ref.keys()
    for k, v in ref.items():
        assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k


# ---------------------------------------------------------------- routing agreement


def test_routing_agreement_hand_case():
    # 3 tokens, 2 layers, top-2
    train = torch.tensor([[[0, 1], [2, 3]], [[1, 0], [2, 2]], [[4, 5], [6, 7]]])
    roll = torch.tensor([[[1, 0], [2, 3]], [[1, 0], [2, 3]], [[4, 6], [7, 6]]])
    # layer 0: {0,1}={0,1} (order ignored), {0,1}={0,1}, {4,5}!={4,6} -> 2/3
    # layer 1: {2,3}={2,3}, {2,2}!={2,3}, {6,7}={6,7} (order ignored) -> 2/3
    assert routing_agreement(train, roll) == pytest.approx([2 / 3, 2 / 3], rel=1e-12)
    assert routing_agreement(train, train) == [1.0, 1.0]
    # dtypes the engine and trainer record (int16 / int32 / int64) mix freely
    assert routing_agreement(train.to(torch.int16), roll.to(torch.int32)) == pytest.approx([2 / 3, 2 / 3])


def test_routing_agreement_matches_set_reference():
    g = torch.Generator().manual_seed(5)
    train = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(60)]).view(20, 3, 2)
    roll = train.clone()
    flip = torch.rand(20, 3, generator=g) < 0.3
    roll[flip] = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(int(flip.sum()))])
    roll = roll.flip(-1)  # engine lists them in the other order
    ref = [sum(set(train[i, l].tolist()) == set(roll[i, l].tolist()) for i in range(20)) / 20 for l in range(3)]
    assert routing_agreement(train, roll) == pytest.approx(ref, rel=1e-12)
    assert min(ref) < 1.0


def test_routing_agreement_edges():
    assert routing_agreement(torch.zeros(0, 4, 2), torch.zeros(0, 4, 2)) == [1.0] * 4
    with pytest.raises(ValueError):
        routing_agreement(torch.zeros(3, 2, 2), torch.zeros(3, 2, 1))
    with pytest.raises(ValueError):
        routing_agreement(torch.zeros(3, 2), torch.zeros(3, 2))

"""The gap per response-length bucket: buckets are powers of two, each bucket's metrics are
those of its own sequences, and the buckets recombine into the overall metrics
(token-level ones token-weighted, sequence-level ones sequence-weighted)."""

import math

import pytest
import torch

from quantroll.metrics.by_length import (BUCKET_METRICS, SEQUENCE_LEVEL, TOKEN_LEVEL, combine_buckets,
                                         length_bucket, mismatch_by_length)
from quantroll.metrics.mismatch import mismatch_metrics


def ragged(seed: int, lengths: list[int], width: int = 40):
    g = torch.Generator().manual_seed(seed)
    roll = -torch.rand(len(lengths), width, generator=g) * 3
    train = roll + torch.randn(len(lengths), width, generator=g) * 0.05
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    train[~mask] = float("nan")  # padding is never read
    return train, roll, mask


LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 31, 33, 40, 0, 6, 12]


@pytest.mark.parametrize("n, bucket", [(1, 1), (2, 2), (3, 2), (4, 4), (7, 4), (8, 8), (1023, 512), (1024, 1024),
                                       (16383, 8192), (16384, 16384)])
def test_bucket_is_the_power_of_two_at_or_below(n, bucket):
    assert length_bucket(n) == bucket == 2 ** math.floor(math.log2(n))


def test_a_zero_length_has_no_bucket():
    with pytest.raises(ValueError):
        length_bucket(0)


def test_each_bucket_holds_exactly_its_sequences():
    train, roll, mask = ragged(0, LENGTHS)
    buckets = mismatch_by_length(train, roll, mask)
    expected = {}
    for i, n in enumerate(LENGTHS):
        if n:
            expected.setdefault(str(2 ** math.floor(math.log2(n))), []).append(i)
    assert list(buckets) == sorted(expected, key=int)
    for key, rows in expected.items():
        assert buckets[key]["seqs"] == len(rows) and buckets[key]["tokens"] == sum(LENGTHS[i] for i in rows)
        # the bucket's |logp diff| by a float64 loop over its own tokens
        diffs = [abs(float(train[i, t]) - float(roll[i, t])) for i in rows for t in range(LENGTHS[i])]
        assert buckets[key]["train_rollout_logprob_abs_diff"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-12)


def test_buckets_sum_back_to_the_overall_metrics():
    train, roll, mask = ragged(1, LENGTHS)
    overall = mismatch_metrics(train, roll, mask)
    buckets = mismatch_by_length(train, roll, mask)
    tokens = sum(b["tokens"] for b in buckets.values())
    seqs = sum(b["seqs"] for b in buckets.values())
    assert tokens == overall["mismatch_tokens"] and seqs == overall["mismatch_seqs"]
    for k in TOKEN_LEVEL:
        assert sum(b[k] * b["tokens"] for b in buckets.values()) / tokens == pytest.approx(overall[k], rel=1e-10), k
    for k in SEQUENCE_LEVEL:
        assert sum(b[k] * b["seqs"] for b in buckets.values()) / seqs == pytest.approx(overall[k], rel=1e-10), k
    assert set(BUCKET_METRICS) == set(TOKEN_LEVEL) | set(SEQUENCE_LEVEL)


def test_combining_steps_equals_bucketing_them_together():
    a, b = ragged(2, [3, 9, 17, 4]), ragged(3, [5, 9, 30, 1, 2])
    joined = tuple(torch.cat([x, y]) for x, y in zip(a, b))
    combined = combine_buckets([mismatch_by_length(*a), mismatch_by_length(*b)])
    direct = mismatch_by_length(*joined)
    assert list(combined) == list(direct)
    for key in direct:
        assert combined[key]["tokens"] == direct[key]["tokens"] and combined[key]["seqs"] == direct[key]["seqs"]
        for k in BUCKET_METRICS:
            assert combined[key][k] == pytest.approx(direct[key][k], rel=1e-10), (key, k)

"""The train/rollout gap per response-length bucket.

Per-sequence importance weights multiply per-token ratios, so a gap that is harmless
at 8 tokens can blow up the sequence-level weights at 8K (the published FP8 rollouts
that matched BF16 below ~4K tokens drifted at 8K and collapsed at 16K). A step's
overall gap hides that: it is dominated by whichever lengths the batch happens to
hold. So every step also reports the mismatch metrics of each bucket of response
lengths, powers of two: bucket ``b`` holds the sequences whose response has
``b <= length < 2b`` tokens.

Only the metrics that are means are split, so that buckets recombine exactly: the
token-level ones (means over tokens) are the token-weighted mean of their buckets,
the sequence-level ones (means over sequences) the sequence-weighted mean. Maxima and
correlations do not recombine and stay overall-only.
"""

from __future__ import annotations

import torch

from quantroll.metrics.mismatch import mismatch_metrics

TOKEN_LEVEL = ("train_rollout_logprob_abs_diff", "train_rollout_kl", "chi2_token")
SEQUENCE_LEVEL = ("log_ppl_diff", "ppl_ratio", "chi2_seq")
BUCKET_METRICS = TOKEN_LEVEL + SEQUENCE_LEVEL


def length_bucket(length: int) -> int:
    """The power of two ``b`` with ``b <= length < 2b`` (length >= 1)."""
    if length < 1:
        raise ValueError(f"a response-length bucket needs a length >= 1, got {length}")
    return 1 << (int(length).bit_length() - 1)


def mismatch_by_length(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, dict]:
    """``{str(bucket): {"tokens", "seqs", metric: value}}`` for the buckets that hold a sequence,
    each computed by ``mismatch_metrics`` on that bucket's sequences alone. Sequences
    without response tokens belong to no bucket (they count nowhere overall either)."""
    m = mask if mask.dtype == torch.bool else mask != 0
    lengths = m.sum(dim=1).tolist()
    rows: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        if n > 0:
            rows.setdefault(length_bucket(n), []).append(i)
    out = {}
    for bucket in sorted(rows):
        idx = torch.tensor(rows[bucket])
        metrics = mismatch_metrics(train_logp[idx], rollout_logp[idx], m[idx])
        out[str(bucket)] = {"tokens": metrics["mismatch_tokens"], "seqs": metrics["mismatch_seqs"],
                            **{k: metrics[k] for k in BUCKET_METRICS}}
    return out


def combine_buckets(buckets: list[dict[str, dict]]) -> dict[str, dict]:
    """Several steps' (or runs') buckets merged into one, each metric weighted as it
    recombines: token-level by tokens, sequence-level by sequences. Non-finite values
    (the sink writes them as strings) leave their bucket's metric out of the merge."""
    totals: dict[str, dict] = {}
    for step in buckets:
        for key, b in step.items():
            t = totals.setdefault(key, {"tokens": 0, "seqs": 0, "sums": {}, "weights": {}})
            t["tokens"] += int(b.get("tokens", 0))
            t["seqs"] += int(b.get("seqs", 0))
            for name in BUCKET_METRICS:
                value, weight = b.get(name), b.get("tokens" if name in TOKEN_LEVEL else "seqs", 0)
                if isinstance(value, (int, float)) and value == value and abs(value) != float("inf") and weight:
                    t["sums"][name] = t["sums"].get(name, 0.0) + value * weight
                    t["weights"][name] = t["weights"].get(name, 0) + weight
    out = {}
    for key in sorted(totals, key=int):
        t = totals[key]
        out[key] = {"tokens": t["tokens"], "seqs": t["seqs"],
                    **{n: t["sums"][n] / t["weights"][n] for n in BUCKET_METRICS if t["weights"].get(n)}}
    return out

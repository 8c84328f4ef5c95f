"""The numbers attribution compares, as pure tensor functions (float64 sums).

- ``gap``: the train/rollout gap of one batch, the compare study's main metric
  (mean |logp_train - logp_rollout| over response tokens, metrics/mismatch.py).
- ``relative_error``: ||a - b|| / ||b|| over the valid rows, the divergence of a hidden
  state or of one linear's output from its BF16 reference.
- ``routing_flips``: the share of valid tokens whose top-k expert *set* differs.
"""

from __future__ import annotations

import torch

from quantroll.metrics.mismatch import mismatch_metrics

MAIN_GAP = "train_rollout_logprob_abs_diff"


def gap(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> float:
    return mismatch_metrics(train_logp, rollout_logp, mask)[MAIN_GAP]


def squared_sums(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[float, float]:
    """(sum (a - b)^2, sum b^2) over the rows where ``valid`` (leading dims of a) is true."""
    a, b = a.detach().double(), b.detach().double()
    if valid is not None:
        a, b = a[valid], b[valid]
    return float((a - b).square().sum()), float(b.square().sum())


def relative_error(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor | None = None) -> float:
    """||a - b|| / ||b|| (0 when both are zero, inf when only b is)."""
    num, den = squared_sums(a, b, valid)
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return (num / den) ** 0.5


def routing_flips(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> float:
    """Share of valid tokens (a, b: [N, k] expert indices) whose expert sets differ."""
    if a.shape != b.shape:
        raise ValueError(f"expert choices of different shapes: {tuple(a.shape)} vs {tuple(b.shape)}")
    same = (a.long().sort(dim=-1).values == b.long().sort(dim=-1).values).all(dim=-1)
    n = int(valid.sum())
    return 0.0 if n == 0 else float((~same[valid]).double().sum()) / n

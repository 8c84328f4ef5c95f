"""Policy-gradient loss pieces: the clipped PPO surrogate, KL penalties, and the reduction.

Everything works on padded ``[B, T]`` response-token tensors. ``mask`` marks the tokens
that count (any nonzero value counts; bool or float). Values at padded positions are
never read: they may hold garbage, even NaN or -inf, without reaching the result.

The reduction is separate from the per-token loss on purpose: the corrections in
``corrections.py`` act between the two (they multiply the per-token loss by an
importance weight, or drop tokens from the numerator), and the choice of reduction
(``--loss-agg``) must be reported with every run because it changes what a step does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Log-ratios are clamped to +-LOG_RATIO_CLAMP before exp, as verl and slime do, so that
# one runaway token gives a large finite number rather than inf (and inf * 0 = NaN in
# the backward pass). exp(20) ~ 4.9e8 is far past any clip bound anyone uses.
LOG_RATIO_CLAMP = 20.0

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")
AGG_MODES = ("token-mean", "seq-mean-token-mean")


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """The mask as bool (nonzero = counts)."""
    return mask if mask.dtype == torch.bool else mask != 0


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless every tensor is 2-D ``[B, T]`` and all shapes agree."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected [B, T] tensors of one shape, got {shapes}")


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped PPO surrogate: ``-min(r*A, clip(r, 1-eps, 1+eps_high)*A)``.

    ``r = exp(logp - old_logp)`` with the log-ratio clamped to +-20 first (verl does the
    same; it only matters when something has already gone badly wrong). ``old_logp`` is
    the trainer's own recomputed log-probability (no gradient); ``logp`` carries the
    gradient. ``eps_clip_high`` defaults to ``eps_clip`` (DAPO's clip-higher sets it
    larger). Why clip: a step may move each token's probability by at most a factor
    ``1 +- eps`` in the direction the advantage favours; past that the gradient is zero.

    Returns ``(per_token_loss [B, T], clipfrac_mask [B, T] bool)``. ``clipfrac_mask`` is
    True where the clipped term is strictly the larger loss (so the token got no
    gradient), as slime and verl count it; reduce it with the response mask to get the
    clip fraction. Neither output is masked: reduce with ``aggregate``.
    """
    check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages)
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    if not (0 <= eps_clip < 1 and eps_clip_high >= 0):
        raise ValueError(f"need 0 <= eps_clip < 1 and eps_clip_high >= 0, got {eps_clip}, {eps_clip_high}")
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    return torch.maximum(loss_unclipped, loss_clipped), loss_clipped > loss_unclipped


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled token's log-probs.

    With ``d = logp - ref_logp`` (Schulman, "Approximating KL divergence", 2020):

    - ``k1`` = d: unbiased, but negative about half the time;
    - ``k2`` = d^2 / 2: never negative, low variance, biased;
    - ``k3`` = exp(-d) + d - 1: never negative and unbiased (no clamp at all here,
      as slime's ``compute_approx_kl`` computes it), evaluated as ``expm1(-d) + d``:
      ``exp(-d) - 1`` in float32 rounds to 0 for |d| < 6e-8 and leaves ``d``, so the
      literal formula goes negative exactly where the policies agree;
    - ``low_var_kl`` = k3 as verl computes it (``verl/trainer/ppo/core_algos.py``,
      ``kl_penalty``): ``kl = clamp(ref - logp, -20, 20)``, ``clamp(exp(kl) - kl - 1,
      -10, 10)``. The inner clamp keeps exp finite, so the gradient of a token past
      the outer clamp is 0 rather than 0 * inf = NaN. (verl treats "k3" as an alias of
      this; slime keeps k3 unclamped and clamps only low_var_kl to [-10, 10].)

    Not masked: reduce with ``aggregate``.
    """
    check_same_shape(logp=logp, ref_logp=ref_logp)
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        return torch.expm1(-d) + d
    if kind == "low_var_kl":
        kl = (-d).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.expm1(kl) - kl).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL kind {kind!r}; choose one of {KL_KINDS}")


@dataclass(frozen=True)
class Denominators:
    """What a whole (mini)batch's loss divides by: its response tokens, and its sequences
    that have any. A micro-batch divides by its minibatch's, so that the micro-batches'
    losses (and gradients) add up to the minibatch's."""

    tokens: float
    sequences: int


def denominators(denom_mask: torch.Tensor) -> Denominators:
    den = as_bool_mask(denom_mask)
    return Denominators(float(den.sum()), int(den.any(dim=1).sum()))


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    denom_mask: torch.Tensor | None = None,
    over: Denominators | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    - ``token-mean``: ``sum(loss * mask) / sum(denom_mask)`` over the whole batch, so
      every response token weighs the same (long answers weigh more). The default.
    - ``seq-mean-token-mean``: each sequence's ``sum(loss * mask_b) / sum(denom_b)``,
      then the mean over sequences whose denominator is nonzero (a sequence with no
      tokens is skipped, not counted as 0 and never a 0/0 NaN), so every answer weighs
      the same.

    ``denom_mask`` defaults to ``mask``. Mask-mode corrections pass the original
    response mask here and the reduced mask as ``mask``: tokens outside ``[c, C]``
    leave the numerator while the denominator keeps the original token count
    (docs/ARCHITECTURE.md, "Contracts"). ``over``: the denominators of the batch this one is a micro-batch of
    (default: this batch's own). With nothing to average the result is a 0 that stays
    attached to the graph, so ``backward()`` still works and gives zero gradients.

    Masked-out positions are selected away (``torch.where``), not multiplied by 0, so
    a NaN in padding cannot leak into the value.
    """
    if denom_mask is None:
        denom_mask = mask
    check_same_shape(per_token=per_token, mask=mask, denom_mask=denom_mask)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {AGG_MODES}")
    over = over or denominators(denom_mask)
    num_mask = as_bool_mask(mask)
    den = as_bool_mask(denom_mask).to(per_token.dtype)
    masked = torch.where(num_mask, per_token, torch.zeros_like(per_token))
    zero = (per_token * 0.0).nan_to_num(0.0, 0.0, 0.0).sum()  # graph-attached zero
    if mode == "token-mean":
        return masked.sum() / over.tokens if over.tokens > 0 else zero
    seq_den = den.sum(dim=1)
    has_tokens = seq_den > 0
    if not bool(has_tokens.any()) or not over.sequences:
        return zero
    return (masked.sum(dim=1)[has_tokens] / seq_den[has_tokens]).sum() / over.sequences


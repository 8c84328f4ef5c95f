"""Advantages from scalar outcome rewards: GRPO and REINFORCE++.

Both are critic-free: the baseline comes from the other samples of the batch rather
than from a learned value function, which is what makes them cheap enough for a tiny
model on a CPU and the usual choice in Miles / slime / verl recipes.

Rewards are one float per sample, ``[B]``, with the ``n_samples_per_prompt`` samples
of one prompt consecutive (sample ``i`` belongs to prompt ``i // group_size``), the
order in which the rollout produces them. Statistics are computed in float64 and the
result is returned in the rewards' dtype (float32 in the trainer).
"""

from __future__ import annotations

import torch

from quantroll.trainer.losses import as_bool_mask

WHITEN_EPS = 1e-8  # slime's distributed_masked_whiten and verl's masked_whiten use 1e-8


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"batch of {rewards.numel()} rewards does not split into groups of {group_size}")
    return rewards.to(torch.float64).view(-1, group_size)


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: each sample's reward against the other samples of its prompt.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` over the ``group_size`` consecutive samples
    of a prompt, with ``std`` the unbiased (n - 1) standard deviation, as verl
    (``compute_grpo_outcome_advantage``, ``torch.std``) and slime compute it.
    ``normalize_std=False`` gives ``r_i - mean_g`` (Dr. GRPO), which keeps the reward's
    scale and does not blow up groups whose rewards barely differ.

    A group whose rewards are all equal gets advantage 0: nothing to prefer, nothing
    learned. ``group_size`` must be at least 2 (a lone sample has no baseline; verl
    would pass its raw reward through, which silently turns GRPO into plain
    REINFORCE): use ``reinforce_plus_plus_advantages`` for one sample per prompt.

    Returns ``[B]``, one advantage per sample; ``broadcast_to_tokens`` spreads it over
    the response tokens.
    """
    if group_size < 2:
        raise ValueError(
            f"GRPO needs at least 2 samples per prompt (got group_size={group_size}); "
            "use reinforce_plus_plus for one sample per prompt"
        )
    g = _grouped(rewards, group_size)
    centred = g - g.mean(dim=1, keepdim=True)
    if normalize_std:
        centred = centred / (g.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1).to(rewards.dtype)


def broadcast_to_tokens(per_sample: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` -> ``[B, T]``: the sample's value on each of its response tokens, 0 elsewhere."""
    m = as_bool_mask(mask)
    if m.dim() != 2 or per_sample.shape != (m.shape[0],):
        raise ValueError(f"need per_sample [B] and mask [B, T], got {tuple(per_sample.shape)}, {tuple(m.shape)}")
    return torch.where(m, per_sample[:, None], 0.0)


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_size: int | None = None,
    eps: float = WHITEN_EPS,
) -> torch.Tensor:
    """REINFORCE++: the return on every response token, whitened over the whole batch.

    Exact definition (outcome reward only, discount gamma = 1, no KL folded into the
    reward: quantroll applies KL as a loss term, ``--use-kl-loss``):

    1. per-token return ``G_bt = r_b`` on each response token of sample ``b``
       (with gamma = 1 the return-to-go of a reward paid at the last token is the reward
       itself, as verl's ``compute_reinforce_plus_plus_outcome_advantage`` and slime's
       ``get_reinforce_plus_plus_returns`` compute it);
    2. optional baseline form (``group_size`` given; verl/slime
       ``reinforce_plus_plus_baseline``): ``r_b`` minus the mean reward of its prompt's
       group, before step 1. ``group_size=None`` (the default) is the plain form: no
       per-prompt baseline, the global mean of step 3 is the only baseline;
    3. global whitening over every response token of the batch (a masked, token-weighted
       mean and variance, so longer responses weigh more, as in slime's
       ``distributed_masked_whiten`` and verl's ``masked_whiten``):
       ``A_bt = (G_bt - mean) / sqrt(var + eps)``, with ``var`` the unbiased (Bessel,
       n/(n-1)) variance over the n response tokens (plain variance when n = 1).

    Returns ``[B, T]`` in the rewards' dtype, 0 at masked positions. A batch with no
    response tokens gives all zeros; a batch whose returns are all equal gives zeros too
    (nothing to prefer).
    """
    m = as_bool_mask(mask)
    if rewards.dim() != 1 or m.dim() != 2 or m.shape[0] != rewards.shape[0]:
        raise ValueError(f"need rewards [B] and mask [B, T], got {tuple(rewards.shape)}, {tuple(m.shape)}")
    r = rewards.to(torch.float64)
    if group_size is not None:
        g = _grouped(rewards, group_size)
        r = (g - g.mean(dim=1, keepdim=True)).reshape(-1)
    returns = torch.where(m, r[:, None], 0.0)
    n = m.sum()
    if n == 0:
        return torch.zeros(m.shape, dtype=rewards.dtype, device=m.device)
    mean = returns.sum() / n
    var = (torch.where(m, returns - mean, 0.0).square().sum()) / n
    if n >= 2:
        var = var * n / (n - 1)
    adv = (returns - mean) * torch.rsqrt(var + eps)
    return torch.where(m, adv, 0.0).to(rewards.dtype)

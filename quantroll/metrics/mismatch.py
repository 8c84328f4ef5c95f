"""How far the trainer's policy is from the policy that generated the rollout.

The engine reports, for each sampled response token, its log-probability under the
rollout policy q (rollout precision); the trainer recomputes it under its own policy
p (trainer precision, same weights otherwise). With ``r = logp_train - logp_rollout``
per response token, these numbers say how large the gap is and whether a correction
is needed, from step 0 (before any update, where an exact BF16 engine gives ~0).

Everything is computed in float64 and returned as Python floats. Token metrics are
means over all response tokens of the batch; sequence metrics are means over the
sequences that have at least one response token. Padding (``mask`` == 0) is never
read, so it may hold anything, -inf included.

Log ratios are clamped to +-20 before every ``exp`` (for sequences: the aggregated
log ratio), as the corrections do, so one runaway token gives a huge finite number
rather than inf. ``train_rollout_logprob_abs_diff`` and ``log_ppl_diff`` take no exp
and are not clamped.

Empty input (no response tokens): every metric is 0.0 and the counts
``mismatch_tokens`` / ``mismatch_seqs`` are 0, so a consumer can tell "no data" from
"no gap" without ever seeing NaN.
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0  # the corrections' clamp (quantroll.trainer.losses.LOG_RATIO_CLAMP)

METRIC_NAMES = (
    "train_rollout_logprob_abs_diff",
    "train_rollout_kl",
    "log_ppl_diff",
    "ppl_ratio",
    "chi2_token",
    "chi2_seq",
    "train_rollout_prob_abs_diff_max",
    "train_rollout_prob_abs_diff_mean",
    "train_rollout_prob_pearson",
)


def _exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def mismatch_metrics(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The mismatch metrics (docs/metrics.md) of one batch of ``[B, T]`` response tokens.

    - ``train_rollout_logprob_abs_diff`` = mean |r|.
    - ``train_rollout_kl`` = mean(exp(r) - 1 - r): the k3 estimate of KL(rollout ||
      train). Direction: tokens are drawn from q (rollout), and
      E_q[p/q - 1 - log(p/q)] = 1 - 1 + E_q[log(q/p)] = KL(q || p). Never negative.
    - ``log_ppl_diff`` = mean over sequences of (log ppl_train - log ppl_rollout), with
      log ppl = -(mean log-prob over the sequence's tokens); equal to -mean_b(r).
      Positive: the trainer finds the rollout's text less likely than the engine did.
    - ``ppl_ratio`` = mean over sequences of exp(log ppl_train - log ppl_rollout).
    - ``chi2_token`` = mean(exp(2r)) - 1, the chi-square divergence chi2(p || q)
      estimated on q's samples (E_q[(p/q)^2] - 1): the variance of token-level
      importance weights, which governs how noisy TIS is.
    - ``chi2_seq`` = mean over sequences of exp(2 * S_b) - 1, S_b = sum of r over the
      sequence clamped to +-20: the same for the sequence-level (product) weight.
    - ``train_rollout_prob_abs_diff_max`` / ``_mean``: max and mean |p_train - p_rollout|
      with p = exp(log-prob) of the sampled token (bounded by 1, so robust to the
      very unlikely tokens that dominate log-space metrics).
    - ``train_rollout_prob_pearson``: Pearson correlation of p_train and p_rollout over
      tokens. Undefined when either side has zero variance (e.g. one token): then 1.0
      if the two are equal everywhere, else 0.0.
    - ``mismatch_tokens`` / ``mismatch_seqs``: how many tokens and sequences counted.
    """
    if train_logp.shape != rollout_logp.shape or train_logp.shape != mask.shape or train_logp.dim() != 2:
        raise ValueError(
            f"expected [B, T] tensors of one shape, got {tuple(train_logp.shape)}, "
            f"{tuple(rollout_logp.shape)}, {tuple(mask.shape)}"
        )
    with torch.no_grad():
        m = mask if mask.dtype == torch.bool else mask != 0
        n_tok = int(m.sum())
        counts = m.sum(dim=1)
        has = counts > 0
        n_seq = int(has.sum())
        if n_tok == 0:
            return {**dict.fromkeys(METRIC_NAMES, 0.0), "mismatch_tokens": 0, "mismatch_seqs": 0}
        lt = train_logp.detach().double()[m]
        lr = rollout_logp.detach().double()[m]
        r = lt - lr
        r_full = torch.where(m, train_logp.detach().double() - rollout_logp.detach().double(), 0.0)
        seq_sum = r_full.sum(dim=1)[has]
        seq_mean = seq_sum / counts[has]
        log_ppl_diff = -seq_mean  # (-mean lt) - (-mean lr)
        pt, pr = torch.exp(lt), torch.exp(lr)
        dp = (pt - pr).abs()
        return {
            "train_rollout_logprob_abs_diff": float(r.abs().mean()),
            "train_rollout_kl": float((torch.expm1(r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)) - r).mean()),
            "log_ppl_diff": float(log_ppl_diff.mean()),
            "ppl_ratio": float(_exp(log_ppl_diff).mean()),
            "chi2_token": float(_exp(r).square().mean() - 1.0),
            "chi2_seq": float(_exp(seq_sum).square().mean() - 1.0),
            "train_rollout_prob_abs_diff_max": float(dp.max()),
            "train_rollout_prob_abs_diff_mean": float(dp.mean()),
            "train_rollout_prob_pearson": _pearson(pt, pr),
            "mismatch_tokens": n_tok,
            "mismatch_seqs": n_seq,
        }


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    xc, yc = x - x.mean(), y - y.mean()
    denom = torch.sqrt(xc.square().sum() * yc.square().sum())
    if denom == 0:
        return 1.0 if torch.equal(x, y) else 0.0
    return float((xc * yc).sum() / denom)


def routing_agreement(train_experts: torch.Tensor, rollout_experts: torch.Tensor) -> list[float]:
    """Per MoE layer, the share of tokens whose top-k expert SETS agree.

    Inputs are ``[N, L, k]`` expert indices (N token positions, L MoE layers, top-k),
    as the engine records them (docs/ARCHITECTURE.md: routed experts ``[P + R - 1, layers, top_k]``)
    and as the trainer's router picks them. Order within the k is ignored (the engines
    may list the same experts in another order), so both are sorted before comparing.
    Returns L floats in [0, 1]; with N = 0 every layer gives 1.0 (nothing disagrees).
    With routing replay the trainer uses the engine's choices, so this is 1.0 by
    construction; without it, it measures how often precision flips a routing choice.
    """
    if train_experts.shape != rollout_experts.shape or train_experts.dim() != 3:
        raise ValueError(
            f"expected two [N, L, k] tensors of one shape, got {tuple(train_experts.shape)}, "
            f"{tuple(rollout_experts.shape)}"
        )
    n, layers, _ = train_experts.shape
    if n == 0:
        return [1.0] * layers
    a = train_experts.long().sort(dim=-1).values
    b = rollout_experts.long().sort(dim=-1).values
    same = (a == b).all(dim=-1)  # [N, L]
    return [float(v) for v in same.double().mean(dim=0)]

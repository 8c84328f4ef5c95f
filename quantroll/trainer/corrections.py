"""Rollout/training mismatch corrections: truncated importance sampling and masking.

Why: the engine samples from a policy q (FP8 weights, its own kernels) while the
trainer computes gradients for p (BF16). The tokens are q's samples, so a policy
gradient for p needs the importance ratio p/q per token; left out, the gap acts as a
hidden off-policy shift that grows with response length. The ratio itself can be huge,
so it is either truncated (TIS: ``w = clamp(ratio, c, C)`` multiplies the loss) or the
tokens whose ratio lies outside ``[c, C]`` are dropped from the loss (mask mode, IcePop
/ MIS) while the kept ones use the ratio.

One signature for every variant (docs/ARCHITECTURE.md, "Contracts")::

    correct(pg_loss, train_logp, rollout_logp, mask, cfg) -> (pg_loss, mask, metrics)

``pg_loss`` is the per-token loss after PPO clipping, before reduction; reduce the
result with ``aggregate(pg_loss, mask_out, mode, denom_mask=mask)`` so that the
denominator keeps the original token count. ``train_logp`` is the trainer's own
recomputed ("old") log-probability, ``rollout_logp`` what the engine reported.

Decisions (all tested):

- log ratio ``r = train_logp - rollout_logp`` on response tokens (padding is never
  read). Levels: ``token`` uses ``r`` per token; ``sequence`` uses the sum of ``r``
  over the sequence's tokens (the product of the ratios); ``geometric`` the mean of
  ``r`` (the geometric mean of the ratios). The sequence's value applies to each of
  its tokens. The (aggregated) log ratio is clamped to +-20 before ``exp``.
- Weights are computed without gradient (float64 internally, cast to ``pg_loss``'s
  dtype): gradient flows only through ``pg_loss``, scaled by the weight.
- Bounds are inclusive: a ratio exactly equal to ``c`` or ``C`` is kept (mask mode) and
  is not counted as clamped (truncate mode). Ratios are compared after the +-20 clamp,
  so a bound beyond ``exp(20)`` never triggers.
- Metrics are over "units": tokens at token level, sequences with at least one
  response token at sequence/geometric level. ``tis`` = mean ratio before the
  ``[c, C]`` clamp; ``tis_clipfrac`` = share of units outside ``[c, C]``; ``tis_abs`` =
  mean ``|ratio - 1|``; ``ess_ratio`` = ``(sum w)^2 / (n sum w^2)`` of the weights
  actually applied (0 for a dropped unit), 0 when every weight is 0;
  ``masked_fraction`` = share of response tokens dropped from the numerator (0 in
  truncate mode); ``tis_ratio_min`` / ``tis_ratio_max`` = the smallest and largest ratio
  before the clamp (what says whether the bounds were ever near); ``tis_count`` = n
  units. No units: every metric 0.0 (the ratio range 1.0), count 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch

from quantroll.errors import QuantrollError
from quantroll.trainer.losses import LOG_RATIO_CLAMP, as_bool_mask, check_same_shape

MODES = ("truncate", "mask")
LEVELS = ("token", "sequence", "geometric")
# Default (c, C) per mode. TIS's c = 0 never masks anything low, so mask mode has its
# own defaults, the bounds IcePop used.
DEFAULT_BOUNDS = {"truncate": (0.0, 2.0), "mask": (0.5, 5.0)}


@dataclass(frozen=True)
class CorrectionConfig:
    """What ``--use-tis --tis-mode --tis-level --tis-clip --tis-clip-low`` and routing replay
    (``--use-rollout-routing-replay``, ``--use-routing-replay``) ask for: every correction
    the trainer applies, checked here once (each field's metadata names its flag).

    ``clip`` (C) and ``clip_low`` (c) are ``None`` unless the user gave them; ``None``
    means the default of the mode (truncate: c = 0, C = 2; mask: c = 0.5, C = 5), so
    "the user gave bounds" is explicit and switching mode never keeps a stale default.
    The bounds in use, defaults included, must satisfy c <= C (inclusive: c = C weighs
    every token C): a bound checked only when both are given would let ``--tis-clip-low 3``
    (against the default C = 2) through to a correction that clips everything. R3 (``rollout_routing_replay``) forces the
    engine's expert choices in the trainer; ``routing_replay`` records the trainer's own
    in the old-logprob pass and replays them in training.
    """

    enabled: bool = field(default=False, metadata={"flag": "use_tis"})
    mode: str = field(default="truncate", metadata={"flag": "tis_mode"})
    level: str = field(default="token", metadata={"flag": "tis_level"})
    clip: float | None = field(default=None, metadata={"flag": "tis_clip"})
    clip_low: float | None = field(default=None, metadata={"flag": "tis_clip_low"})
    rollout_routing_replay: bool = field(default=False, metadata={"flag": "use_rollout_routing_replay"})
    routing_replay: bool = field(default=False, metadata={"flag": "use_routing_replay"})

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise QuantrollError(f"--tis-mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if self.level not in LEVELS:
            raise QuantrollError(f"--tis-level {self.level!r}: choose one of {', '.join(LEVELS)}")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            raise QuantrollError(f"--tis-clip must be a finite number > 0, got {self.clip!r}")
        if self.clip_low is not None and not (math.isfinite(self.clip_low) and self.clip_low >= 0):
            raise QuantrollError(f"--tis-clip-low must be a finite number >= 0, got {self.clip_low!r}")
        c, C = self.bounds
        if c > C:
            low = f"--tis-clip-low {c}" if self.clip_low is not None else f"the {self.mode} default low bound {c}"
            high = f"--tis-clip {C}" if self.clip is not None else f"the {self.mode} default --tis-clip {C}"
            raise QuantrollError(f"{low} must be below {high}; give both bounds with c < C")

    @staticmethod
    def unused_flags(values: dict) -> list[str]:
        """TIS settings among ``values`` (field -> value, as the command line gives them)
        that differ from their defaults while ``enabled`` is not set: the command line
        refuses them before they reach a config (a bound would otherwise be checked first)."""
        if values.get("enabled"):
            return []
        return [f"--{f.metadata['flag'].replace('_', '-')}" for f in fields(CorrectionConfig)
                if f.name in ("mode", "level", "clip", "clip_low") and values.get(f.name, f.default) != f.default]

    @property
    def bounds(self) -> tuple[float, float]:
        """``(c, C)``: the user's values where given, the mode's defaults otherwise."""
        c_default, C_default = DEFAULT_BOUNDS[self.mode]
        c = c_default if self.clip_low is None else float(self.clip_low)
        C = C_default if self.clip is None else float(self.clip)
        return c, C


def _log_ratios(r: torch.Tensor, m: torch.Tensor, level: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Clamped log ratios: broadcast to ``[B, T]`` (what each token gets), and per unit.

    Units are the response tokens at token level, the sequences with at least one
    response token at sequence/geometric level.
    """
    if level == "token":
        lr = r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return lr, lr[m]
    counts = m.sum(dim=1)
    agg = r.sum(dim=1)
    if level == "geometric":
        agg = agg / counts.clamp(min=1)
    agg = agg.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return agg[:, None].expand_as(r), agg[counts > 0]


def _weights(log_ratio: torch.Tensor, mode: str, c: float, C: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ratio, inside [c, C], weight applied)``; a dropped unit (mask mode) weighs 0."""
    ratio = torch.exp(log_ratio)
    inside = (ratio >= c) & (ratio <= C)
    weight = ratio.clamp(c, C) if mode == "truncate" else torch.where(inside, ratio, 0.0)
    return ratio, inside, weight


def correct(
    pg_loss: torch.Tensor,
    train_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    cfg: CorrectionConfig,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Apply the configured correction to a per-token loss (see the module docstring).

    Returns ``(pg_loss, mask_for_numerator, metrics)``. Disabled: the inputs unchanged
    and ``{}``. Truncate: ``pg_loss * clamp(ratio, c, C)``, the mask unchanged. Mask:
    ``pg_loss * ratio`` on kept tokens and 0 on dropped ones, and the mask without the
    dropped tokens (whole sequences at sequence/geometric level).
    """
    check_same_shape(pg_loss=pg_loss, train_logp=train_logp, rollout_logp=rollout_logp, mask=mask)
    if not cfg.enabled:
        return pg_loss, mask, {}
    c, C = cfg.bounds
    m = as_bool_mask(mask)
    with torch.no_grad():
        r = torch.where(m, train_logp.detach().double() - rollout_logp.detach().double(), 0.0)
        token_lr, unit_lr = _log_ratios(r, m, cfg.level)
        _, inside, weight = _weights(token_lr, cfg.mode, c, C)
        keep = m if cfg.mode == "truncate" else m & inside
        weight = torch.where(m, weight, 1.0)  # padding keeps whatever it held
        metrics = _metrics(*_weights(unit_lr, cfg.mode, c, C), m, keep)

    corrected = pg_loss * weight.to(pg_loss.dtype)
    if cfg.mode == "mask":
        corrected = torch.where(keep | ~m, corrected, torch.zeros_like(corrected))
        mask_out = keep.to(mask.dtype) if mask.dtype != torch.bool else keep
    else:
        mask_out = mask
    return corrected, mask_out, metrics


def _metrics(
    ratio: torch.Tensor, inside: torch.Tensor, weight: torch.Tensor, m: torch.Tensor, keep: torch.Tensor
) -> dict[str, float]:
    """Correction statistics; ``ratio``, ``inside``, ``weight`` are per unit (1-D)."""
    n = ratio.numel()
    n_tokens = int(m.sum())
    masked_fraction = float((m & ~keep).sum()) / n_tokens if n_tokens else 0.0
    if n == 0:
        zeros = dict.fromkeys(("tis", "tis_clipfrac", "tis_abs", "ess_ratio"), 0.0)
        return {**zeros, "masked_fraction": masked_fraction, "tis_ratio_min": 1.0, "tis_ratio_max": 1.0, "tis_count": 0}
    sum_w2 = float(weight.square().sum())
    return {
        "tis": float(ratio.mean()),
        "tis_clipfrac": float((~inside).double().mean()),
        "tis_abs": float((ratio - 1.0).abs().mean()),
        "ess_ratio": float(weight.sum()) ** 2 / (n * sum_w2) if sum_w2 > 0 else 0.0,
        "masked_fraction": masked_fraction,
        "tis_ratio_min": float(ratio.min()),
        "tis_ratio_max": float(ratio.max()),
        "tis_count": n,
    }

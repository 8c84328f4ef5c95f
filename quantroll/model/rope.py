"""Rotary position embeddings, computed as transformers computes them (float32 tables,
the same order of operations), so that logits match it to float32 rounding."""

from __future__ import annotations

import math

import torch

from quantroll.model.config import ModelConfig
from quantroll.model.families.registry import rope_variants


def inverse_frequencies(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] float32, attention scaling) for the config's rope type."""
    r, dim = cfg.rope, cfg.head_dim
    base = r.theta
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    if r.rope_type in ("default", "linear"):
        inv = 1.0 / (base**exponents)
        return (inv / r.factor if r.rope_type == "linear" else inv), 1.0
    if r.rope_type == "yarn":
        return _yarn(cfg, exponents)
    return rope_variants()[r.rope_type].inverse_frequencies(1.0 / (base**exponents), r, cfg.max_position_embeddings), 1.0


def _yarn(cfg: ModelConfig, exponents: torch.Tensor) -> tuple[torch.Tensor, float]:
    r, dim, base = cfg.rope, cfg.head_dim, cfg.rope.theta
    original = r.original_max_position_embeddings or cfg.max_position_embeddings
    factor = r.factor

    def mscale(scale: float) -> float:
        return 1.0 if scale <= 1 else 0.1 * math.log(scale) + 1.0

    attention = r.attention_factor if r.attention_factor is not None else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(r.beta_fast), correction_dim(r.beta_slow)
    if r.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base**exponents
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep, float(attention)


class Rotary(torch.nn.Module):
    """cos/sin for given positions; applied to q and k of shape [B, T, heads, head_dim]."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        inv, self.attention_scaling = inverse_frequencies(cfg)
        self.register_buffer("inv_freq", inv.to(device), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]

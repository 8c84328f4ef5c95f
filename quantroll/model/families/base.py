"""What an architecture family is, as data: the decoder block's optional parts and where
its config.json keeps the switches for them.

Every family quantroll runs is a pre-norm decoder (RMSNorm, rotary attention with GQA,
SwiGLU MLP or a sparse MoE of them) under transformers' tensor names
(``model.layers.N.self_attn.q_proj`` ...). Families differ only in what a ``Family``
states: QK-norm, which projections carry biases (always, never, or as a config key
says), MoE, and defaults transformers assumes for keys a config.json may leave out.
The model code (model/layers.py, model/causal_lm.py) reads a ``Block`` and never a
family's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

# A bias rule: True (always), False (never), or the config.json key (a boolean) that decides.
BiasRule = bool | str

# A rope variant a family brings: (inverse frequencies [head_dim/2] float32, the RopeConfig,
# max_position_embeddings) -> rescaled inverse frequencies.
RopeVariant = Callable[..., object]


@dataclass(frozen=True)
class Rope:
    """A rope type a family defined: its name in config.json, the RopeConfig fields it reads
    (what a written config.json spells out), and the rescaling."""

    name: str
    keys: tuple[str, ...]
    inverse_frequencies: RopeVariant


@dataclass(frozen=True)
class Block:
    """One decoder block's optional parts, resolved for one config."""

    qk_norm: bool  # RMSNorm over head_dim on q and k, before rotary
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool  # gate, up and down projections (dense MLP and experts)


@dataclass(frozen=True)
class Family:
    """An architecture family: the config.json names that select it, its block as rules,
    and transformers' defaults for keys its configs may omit."""

    name: str
    model_types: tuple[str, ...]  # config.json "model_type"
    architectures: tuple[str, ...]  # config.json "architectures" (transformers class names)
    qk_norm: bool
    qkv_bias: BiasRule
    o_bias: BiasRule
    mlp_bias: BiasRule
    moe: bool = False
    default_rope_theta: float = 10_000.0
    rope_variants: tuple[Rope, ...] = ()  # rope types this family defined
    # real model sizes by name, as the config.json keys that differ from nothing (for benches
    # and random checkpoints of real shapes: quantroll/bench/shapes.py)
    shapes: tuple[tuple[str, Mapping[str, object]], ...] = ()

    def block(self, flags: Mapping[str, bool]) -> Block:
        """The block for a config whose boolean keys are ``flags`` (a missing key is false)."""
        def rule(r: BiasRule) -> bool:
            return bool(flags.get(r, False)) if isinstance(r, str) else r

        return Block(self.qk_norm, rule(self.qkv_bias), rule(self.o_bias), rule(self.mlp_bias))

    def bias_keys(self) -> tuple[str, ...]:
        """The config.json keys this family's bias rules read."""
        return tuple(sorted({r for r in (self.qkv_bias, self.o_bias, self.mlp_bias) if isinstance(r, str)}))

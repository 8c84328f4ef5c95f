"""Model configuration read from an HF ``config.json`` (Qwen3 and Qwen3-MoE).

One frozen dataclass for both architectures: a dense model is a MoE model with no
MoE layers. Both spellings transformers has written are accepted (``rope_theta`` /
``rope_scaling`` at the top level, v4; ``rope_parameters``, v5; ``num_experts`` or
``num_local_experts``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from quantroll.errors import QuantrollError

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe")
SUPPORTED_ROPE_TYPES = ("default", "linear", "yarn", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 1_000_000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    # MoE (num_experts == 0 for dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = ()

    def is_moe_layer(self, layer: int) -> bool:
        """Same rule as transformers' Qwen3MoeDecoderLayer."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if self.is_moe_layer(i))


def _rope_from(raw: dict) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.get("rope_theta", raw.get("rope_theta", 1_000_000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise QuantrollError(f"rope type '{rope_type}' is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor") or 1.0),
        original_max_position_embeddings=params.get("original_max_position_embeddings"),
        attention_factor=params.get("attention_factor"),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
    )


def config_from_dict(raw: dict, source: str = "config.json") -> ModelConfig:
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise QuantrollError(
            f"{source}: model_type '{model_type}' is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    try:
        heads = int(raw["num_attention_heads"])
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return ModelConfig(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            rope=_rope_from(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            num_experts=int(raw.get("num_experts", raw.get("num_local_experts", 0)) or 0) if model_type == "qwen3_moe" else 0,
            num_experts_per_tok=int(raw.get("num_experts_per_tok", 0) or 0),
            moe_intermediate_size=int(raw.get("moe_intermediate_size", 0) or 0),
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
            decoder_sparse_step=int(raw.get("decoder_sparse_step", 1) or 1),
            mlp_only_layers=tuple(int(i) for i in raw.get("mlp_only_layers", []) or []),
            eos_token_ids=eos_ids,
        )
    except KeyError as missing:
        raise QuantrollError(f"{source}: required key {missing} is missing") from None


def load_model_config(checkpoint_dir: str | Path) -> ModelConfig:
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise QuantrollError(f"{path} not found; point at an HF checkpoint directory")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise QuantrollError(f"{path} is not valid JSON ({err})") from None
    return config_from_dict(raw, str(path))

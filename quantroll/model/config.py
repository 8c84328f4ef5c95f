"""Model configuration read from an HF ``config.json``, for every family of
model/families/registry.py.

One frozen dataclass for all of them: a dense model is a MoE model with no MoE layers,
and what a family changes in the decoder block is its ``Block`` (``ModelConfig.block``),
resolved from the family's rules and the config's boolean keys. Both spellings
transformers has written are accepted (``rope_theta`` / ``rope_scaling`` at the top
level, v4; ``rope_parameters``, v5; ``num_experts`` or ``num_local_experts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantroll.errors import QuantrollError
from quantroll.jsonfields import JsonFields
from quantroll.model.families import registry
from quantroll.model.families.base import Block, Family

SUPPORTED_MODEL_TYPES = registry.supported_model_types()
SUPPORTED_ROPE_TYPES = ("default", "linear", "yarn", *registry.rope_variants())


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
    low_freq_factor: float = 1.0  # band-wise rescaling (a family's rope variant)
    high_freq_factor: float = 4.0


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
    # the config's boolean keys the family's bias rules read (e.g. attention_bias) that are true
    bias_flags: tuple[str, ...] = ()
    # MoE (num_experts == 0 for dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = ()

    @property
    def family(self) -> Family:
        return registry.family_for(self.model_type)

    @property
    def block(self) -> Block:
        """The decoder block's optional parts (QK-norm, biases) for this config."""
        return self.family.block({key: True for key in self.bias_flags})

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


def _rope_from(raw: dict, source: str, default_theta: float) -> RopeConfig:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    where = "rope_parameters." if raw.get("rope_parameters") else "rope_scaling."
    if not isinstance(params, dict):
        raise QuantrollError(f"{source}: '{where.rstrip('.')}' must be an object, got {params!r}")
    top = JsonFields(raw, source)
    f = JsonFields(params, source, where)
    theta = f.float("rope_theta", None, positive=True) or top.float("rope_theta", default_theta, positive=True)
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise QuantrollError(f"rope type '{rope_type}' is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=f.float("factor", 1.0, positive=True),
        original_max_position_embeddings=f.int("original_max_position_embeddings", None, minimum=1),
        attention_factor=f.float("attention_factor", None),
        beta_fast=f.float("beta_fast", 32.0),
        beta_slow=f.float("beta_slow", 1.0),
        truncate=f.bool("truncate", True),
        low_freq_factor=f.float("low_freq_factor", 1.0),
        high_freq_factor=f.float("high_freq_factor", 4.0),
    )


def config_from_dict(raw: dict, source: str = "config.json") -> ModelConfig:
    if not isinstance(raw, dict):
        raise QuantrollError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    family = registry.family_for(raw.get("model_type"), raw.get("architectures"), source)
    model_type = family.model_types[0] if raw.get("model_type") is None else raw["model_type"]
    f = JsonFields(raw, source)
    if f.bool("use_sliding_window", False):
        raise QuantrollError(f"{source}: use_sliding_window is true; quantroll runs full attention only "
                             "(set it to false if the model was trained without the window)")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise QuantrollError(f"{source}: hidden_act '{act}' is not supported; quantroll's MLP is SwiGLU (silu)")
    heads = f.int("num_attention_heads", minimum=1)
    hidden = f.int("hidden_size", minimum=1)
    kv_heads = f.int("num_key_value_heads", heads, minimum=1)
    if heads % kv_heads:
        raise QuantrollError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                             f"{kv_heads}")
    moe = family.moe
    experts = 0
    if moe:
        experts = f.int("num_experts", None, minimum=0)
        experts = f.int("num_local_experts", 0, minimum=0) if experts is None else experts
    top_k = f.int("num_experts_per_tok", 0, minimum=0) if moe else 0
    if experts and not 1 <= top_k <= experts:
        raise QuantrollError(f"{source}: num_experts_per_tok must be in [1, num_experts = {experts}], got {top_k}")
    return ModelConfig(
        model_type=model_type,
        vocab_size=f.int("vocab_size", minimum=1),
        hidden_size=hidden,
        intermediate_size=f.int("intermediate_size", minimum=1),
        num_hidden_layers=f.int("num_hidden_layers", minimum=1),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=f.int("head_dim", None, minimum=1) or hidden // heads,
        rms_norm_eps=f.float("rms_norm_eps", 1e-6, positive=True),
        max_position_embeddings=f.int("max_position_embeddings", 32768, minimum=1),
        rope=_rope_from(raw, source, family.default_rope_theta),
        tie_word_embeddings=f.bool("tie_word_embeddings", False),
        bias_flags=tuple(key for key in family.bias_keys() if f.bool(key, False)),
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=f.int("moe_intermediate_size", minimum=1) if experts else 0,
        norm_topk_prob=f.bool("norm_topk_prob", False),
        decoder_sparse_step=f.int("decoder_sparse_step", 1, minimum=1),
        mlp_only_layers=f.ints("mlp_only_layers"),
        eos_token_ids=f.ints("eos_token_id"),
    )


def load_model_config(checkpoint_dir: str | Path) -> ModelConfig:
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise QuantrollError(f"{path} not found; point at an HF checkpoint directory")
    from quantroll.inputs import read_json

    return config_from_dict(read_json(path, "config", fix="fix or re-download it"), str(path))


_ROPE_KEYS = {"default": (), "linear": ("factor",),
              "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                       "truncate")}


def config_to_dict(cfg: ModelConfig) -> dict:
    """The config.json transformers writes for ``cfg`` (v5 spelling: ``rope_parameters``),
    which ``config_from_dict`` reads back to ``cfg``: what random checkpoints of a family
    are written with (model/random_checkpoint.py)."""
    family, r = cfg.family, cfg.rope
    keys = _ROPE_KEYS[r.rope_type] if r.rope_type in _ROPE_KEYS else registry.rope_variants()[r.rope_type].keys
    rope = {"rope_type": r.rope_type, "rope_theta": r.theta,
            **{k: getattr(r, k) for k in keys if getattr(r, k) is not None}}
    moe = {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
           "moe_intermediate_size": cfg.moe_intermediate_size, "norm_topk_prob": cfg.norm_topk_prob,
           "decoder_sparse_step": cfg.decoder_sparse_step, "mlp_only_layers": list(cfg.mlp_only_layers)}
    eos = list(cfg.eos_token_ids)
    return {
        "architectures": [family.architectures[0]],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        **{key: key in cfg.bias_flags for key in family.bias_keys()},
        **(moe if family.moe else {}),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "torch_dtype": "bfloat16",
    }

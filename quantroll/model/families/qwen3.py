"""Qwen3 (``Qwen3ForCausalLM``) and Qwen3-MoE (``Qwen3MoeForCausalLM``): QK-norm, no biases
unless ``attention_bias`` (then on q, k, v and o, as transformers builds them)."""

from quantroll.model.families.base import Family

QWEN3 = Family(
    name="qwen3", model_types=("qwen3",), architectures=("Qwen3ForCausalLM",),
    qk_norm=True, qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias=False,
    default_rope_theta=1_000_000.0,
)

QWEN3_MOE = Family(
    name="qwen3_moe", model_types=("qwen3_moe",), architectures=("Qwen3MoeForCausalLM",),
    qk_norm=True, qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias=False, moe=True,
    default_rope_theta=1_000_000.0,
)

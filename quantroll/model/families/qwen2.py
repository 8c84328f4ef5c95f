"""Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``): no QK-norm, biases on q, k and v always and
never on o or the MLP (transformers' Qwen2Attention ignores ``attention_bias``).
Sliding-window attention (``use_sliding_window``) is refused by the config reader."""

from quantroll.model.families.base import Family

QWEN2 = Family(
    name="qwen2", model_types=("qwen2",), architectures=("Qwen2ForCausalLM",),
    qk_norm=False, qkv_bias=True, o_bias=False, mlp_bias=False,
)

"""Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``): no QK-norm, biases on q, k and v always and
never on o or the MLP (transformers' Qwen2Attention ignores ``attention_bias``).
Sliding-window attention (``use_sliding_window``) is refused by the config reader."""

from quantroll.model.families.base import Family

QWEN2 = Family(
    name="qwen2", model_types=("qwen2",), architectures=("Qwen2ForCausalLM",),
    qk_norm=False, qkv_bias=True, o_bias=False, mlp_bias=False,
    shapes=(
        ("qwen2.5-7b", dict(
            vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
            num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=32768, rope_theta=1000000.0)),
        ("qwen2.5-1.5b", dict(
            vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
            num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=32768, rope_theta=1000000.0,
            tie_word_embeddings=True)),
    ),
)

"""The built-in default checkpoint: a tiny Qwen3 written by quantroll itself.

No weights can be downloaded where quantroll is tested, so the default model is made
here from a seed: an HF-format directory (config.json + model.safetensors, BF16) that
transformers' Qwen3ForCausalLM loads with no missing or unexpected keys. Its
dimensions mix multiples of 128 (quantized by default) and a non-multiple (the
k/v projections, kept in BF16 by default), so every path of ``convert`` runs on it.
Its tokenizer is quantroll's character-level one (quantroll/tasks/tokenizer.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from quantroll.tasks.tokenizer import BOS, EOS, PAD, char_vocab, write_char_tokenizer


@dataclass(frozen=True)
class TinyQwen3:
    vocab_size: int = 128  # the character tokenizer's 98 tokens, padded
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 96  # k/v: 96 x 256, not a multiple of 128
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    tie_word_embeddings: bool = False


def qwen3_config_dict(shape: TinyQwen3) -> dict:
    """config.json for a Qwen3ForCausalLM of the given shape."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **asdict(shape),
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": shape.num_hidden_layers,
        "rope_scaling": None,
        "bos_token_id": char_vocab()[BOS],
        "eos_token_id": char_vocab()[EOS],
        "torch_dtype": "bfloat16",
    }


def qwen3_weights(shape: TinyQwen3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random BF16 weights named as transformers names Qwen3 tensors."""
    g = torch.Generator().manual_seed(seed)
    h, hd, inter = shape.hidden_size, shape.head_dim, shape.intermediate_size

    def normal(*dims: int) -> torch.Tensor:
        return (torch.randn(*dims, generator=g) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    w = {"model.embed_tokens.weight": normal(shape.vocab_size, h), "model.norm.weight": ones(h)}
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        w.update({
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": normal(shape.num_attention_heads * hd, h),
            p + "self_attn.k_proj.weight": normal(shape.num_key_value_heads * hd, h),
            p + "self_attn.v_proj.weight": normal(shape.num_key_value_heads * hd, h),
            p + "self_attn.o_proj.weight": normal(h, shape.num_attention_heads * hd),
            p + "self_attn.q_norm.weight": ones(hd),
            p + "self_attn.k_norm.weight": ones(hd),
            p + "mlp.gate_proj.weight": normal(inter, h),
            p + "mlp.up_proj.weight": normal(inter, h),
            p + "mlp.down_proj.weight": normal(h, inter),
        })
    if not shape.tie_word_embeddings:
        w["lm_head.weight"] = normal(shape.vocab_size, h)
    return w


def write_tiny_qwen3(directory: str | Path, shape: TinyQwen3 = TinyQwen3(), seed: int = 0) -> Path:
    """Write the tiny checkpoint to ``directory`` (created) and return its path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(qwen3_config_dict(shape), indent=2) + "\n")
    ids = {"bos_token_id": char_vocab()[BOS], "eos_token_id": char_vocab()[EOS], "pad_token_id": char_vocab()[PAD]}
    (out / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
    write_char_tokenizer(out)
    save_file(qwen3_weights(shape, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out

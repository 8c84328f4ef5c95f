"""The built-in default checkpoint: a tiny Qwen3 written by quantroll itself.

No weights can be downloaded where quantroll is tested, so the default model is made
here from a seed: an HF-format directory (config.json + model.safetensors, BF16) that
transformers' Qwen3ForCausalLM loads with no missing or unexpected keys. Every
dimension of every decoder linear is a multiple of 128 (head_dim 128, one k/v head of
128 rows), so ``convert`` quantizes all of them in fp8, mxfp8 and nvfp4 and a study
of "FP8" measures FP8 everywhere a real checkpoint has it; head_dim is a power of two,
as the GPU's fused decode attention needs. Only the embedding, lm_head, norms and (MoE)
router gates stay BF16, by convert's rules. Shapes with partial blocks are tested on
the fixtures of tests/conftest.py. Its tokenizer is quantroll's character-level one
(quantroll/tasks/tokenizer.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from quantroll.errors import QuantrollError
from quantroll.tasks.tokenizer import BOS, EOS, PAD, char_vocab, write_char_tokenizer


@dataclass(frozen=True)
class TinyQwen3:
    vocab_size: int = 128  # the character tokenizer's 99 tokens, padded
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 128  # q 512 x 256, k/v 128 x 256, o 256 x 512: whole 128 x 128 blocks
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    tie_word_embeddings: bool = False
    # Qwen3-MoE when num_experts > 0: every layer sparse, softmax top-k routing
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True

    @property
    def moe(self) -> bool:
        return self.num_experts > 0


# The MoE variant of the default: 8 experts, top-2, each expert's MLP a sixth of the dense one.
TINY_QWEN3_MOE = TinyQwen3(intermediate_size=768, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128)


def qwen3_config_dict(shape: TinyQwen3) -> dict:
    """config.json for a Qwen3ForCausalLM (or Qwen3MoeForCausalLM) of the given shape."""
    fields = asdict(shape)
    moe_fields = {k: fields.pop(k) for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                              "norm_topk_prob")}
    if shape.moe:
        fields.update(moe_fields, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
                      output_router_logits=False)
    return {
        "architectures": ["Qwen3MoeForCausalLM" if shape.moe else "Qwen3ForCausalLM"],
        "model_type": "qwen3_moe" if shape.moe else "qwen3",
        **fields,
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
        })
        if shape.moe:
            w[p + "mlp.gate.weight"] = normal(shape.num_experts, h)
            for e in range(shape.num_experts):
                w.update(_mlp(f"{p}mlp.experts.{e}.", h, shape.moe_intermediate_size, normal))
        else:
            w.update(_mlp(p + "mlp.", h, inter, normal))
    if not shape.tie_word_embeddings:
        w["lm_head.weight"] = normal(shape.vocab_size, h)
    return w


def _mlp(prefix: str, hidden: int, inter: int, normal) -> dict[str, torch.Tensor]:
    return {prefix + "gate_proj.weight": normal(inter, hidden), prefix + "up_proj.weight": normal(inter, hidden),
            prefix + "down_proj.weight": normal(hidden, inter)}


def write_tiny_qwen3(directory: str | Path, shape: TinyQwen3 = TinyQwen3(), seed: int = 0) -> Path:
    """Write the tiny checkpoint to ``directory`` (created) and return its path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(qwen3_config_dict(shape), indent=2) + "\n")
    ids = {"bos_token_id": char_vocab()[BOS], "eos_token_id": char_vocab()[EOS], "pad_token_id": char_vocab()[PAD]}
    (out / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
    write_char_tokenizer(out, shape.max_position_embeddings)
    save_file(qwen3_weights(shape, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


# -- the shipped default models ------------------------------------------------------
# Warm-started by `quantroll sft` (recipe, seed and accuracies in each directory's
# quantroll_sft.json) and shipped with the package, so `quantroll train` and
# `quantroll compare` start from a model that already gets rewards, in seconds.
DATA_DIR = Path(__file__).parent / "data"
BUILTIN_MODELS = {
    "dense": ("tiny-qwen3-arith", "quantroll sft --save {dir} --force"),
    "moe": ("tiny-qwen3-moe-arith", "quantroll sft --moe --save {dir} --force"),
}


def builtin_checkpoint(kind: str = "dense") -> Path:
    """The shipped warm-started checkpoint ("dense" or "moe")."""
    if kind not in BUILTIN_MODELS:
        raise QuantrollError(f"unknown built-in model {kind!r}; choose one of {', '.join(BUILTIN_MODELS)}")
    name, recipe = BUILTIN_MODELS[kind]
    path = DATA_DIR / name
    if not (path / "model.safetensors").is_file():
        raise QuantrollError(f"the built-in {kind} model is missing from {path}; regenerate it with "
                             f"`{recipe.format(dir=path)}` or reinstall quantroll")
    return path

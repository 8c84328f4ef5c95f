"""Real model shapes for benchmarks, built with random weights (nothing is downloaded)."""

from __future__ import annotations

import dataclasses

import torch

from quantroll.builtin import DATA_DIR
from quantroll.checkpoint.bf16_rule import unless_kept
from quantroll.formats import Format
from quantroll.model.causal_lm import CausalLM
from quantroll.model.config import ModelConfig, RopeConfig, config_from_dict, load_model_config
from quantroll.model.families.registry import shapes as family_shapes

SHAPES = {
    "qwen3-8b": ModelConfig(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        max_position_embeddings=40960, rope=RopeConfig(theta=1_000_000.0)),
    "qwen3-30b-a3b": ModelConfig(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6,
        max_position_embeddings=40960, rope=RopeConfig(theta=1_000_000.0), num_experts=128,
        num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True),
    "qwen3-1.7b": ModelConfig(
        model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        max_position_embeddings=40960, rope=RopeConfig(theta=1_000_000.0), tie_word_embeddings=True),
    # the long-response study's model, as committed (~7M parameters, one KV head)
    "fib-study": load_model_config(DATA_DIR / "fib-qwen3-long"),
    # the other families' sizes, as each family module states them
    **{name: config_from_dict(raw, f"shape {name}") for name, raw in family_shapes().items()},
}


def shape_config(name: str, layers: int | None = None) -> ModelConfig:
    cfg = SHAPES[name]
    return dataclasses.replace(cfg, num_hidden_layers=layers) if layers else cfg


def write_shape_checkpoint(name: str, out, layers: int | None = None, seed: int = 0):
    """A random-weight BF16 HF checkpoint of a dense shape of any family (with quantroll's
    character tokenizer) at ``out``, for GPU runs of train / compare / benches at real sizes."""
    from quantroll.model.random_checkpoint import write_random_checkpoint

    c = shape_config(name, layers)
    if c.num_experts:
        raise ValueError(f"{name}: only dense shapes are written as checkpoints")
    return write_random_checkpoint(c, out, seed)


def layer_gemm_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(N, K) of a dense decoder layer's four GEMMs as the engine runs them (q/k/v and
    gate/up fused): what the decode-GEMM benches time per "layer set"."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * i, h), "down": (h, i)}


EIGHT_B_GEMMS = layer_gemm_shapes(SHAPES["qwen3-8b"])


@torch.no_grad()
def random_model(cfg: ModelConfig, device, fmt: Format | None = None, seed: int = 0,
                 source: CausalLM | None = None) -> CausalLM:
    """A model of ``cfg`` with N(0, 0.02) weights (norms 1); with ``fmt`` every linear of
    the decoder is stored in that format. ``source`` quantizes another model's weights
    instead of drawing new ones (so BF16 and FP8 runs compare the same model)."""
    from quantroll.model.linear import QLinear

    torch.manual_seed(seed)

    model = CausalLM(cfg, unless_kept(lambda _: fmt), dtype=torch.bfloat16, device=device)
    src = dict(source.named_parameters()) if source is not None else {}
    for name, p in model.named_parameters():
        if name in src:
            p.copy_(src[name])
        elif "norm" in name:
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02)
    for module in model.modules():
        if isinstance(module, QLinear) and module.quantized:
            w = src[module.name + ".weight"] if source is not None else torch.empty(
                module.out_features, module.in_features, dtype=torch.bfloat16, device=device).normal_(0.0, 0.02)
            module.load_quantized_(_quantize(fmt, w, module.name))
    return model.eval()


def _quantize(fmt: Format, w: torch.Tensor, name: str):
    """The format's GPU quantizer where it registered one and triton runs (bit for bit the
    reference, far faster on 8B shapes), else the reference."""
    from quantroll.kernels import quantize_weight_gpu, triton_available
    from quantroll.kernels.quantize_launch import gpu_quantizer

    if w.is_cuda and triton_available() and gpu_quantizer(fmt) is not None:
        return quantize_weight_gpu(w, fmt, name=name)
    return fmt.quantize_weight(w, name)

"""The one rule of which modules stay BF16 by name (quantroll/checkpoint/bf16_rule.py): its
answers on module names of every family, and convert's plan, the model builder, the engine
and the update quantizer agreeing on which modules of a random tiny MoE checkpoint quantize."""

import dataclasses

import pytest
import torch

from quantroll.bench.shapes import SHAPES, shape_config
from quantroll.checkpoint import ConvertConfig, PlanRules, convert_checkpoint, plan
from quantroll.checkpoint.bf16_rule import EMBEDDING, LM_HEAD, NORM, ROUTER, kept_by_name, unless_kept
from quantroll.engine import Engine
from quantroll.formats import QuantizedTensor, get_format
from quantroll.model.causal_lm import CausalLM
from quantroll.model.loader import load_model
from quantroll.model.random_checkpoint import random_weights, write_random_checkpoint
from quantroll.sync.update_quantizer import UpdateQuantizer

L = "model.layers.7."
# (module name, reason) as transformers names the modules of each family
COMMON = [
    ("model.embed_tokens", EMBEDDING), ("lm_head", LM_HEAD), ("model.norm", NORM),
    (L + "input_layernorm", NORM), (L + "post_attention_layernorm", NORM),
    (L + "self_attn.q_proj", ""), (L + "self_attn.k_proj", ""), (L + "self_attn.v_proj", ""),
    (L + "self_attn.o_proj", ""),
]
DENSE_MLP = [(L + "mlp.gate_proj", ""), (L + "mlp.up_proj", ""), (L + "mlp.down_proj", "")]
TABLE = {
    "qwen3": COMMON + DENSE_MLP + [(L + "self_attn.q_norm", NORM), (L + "self_attn.k_norm", NORM)],
    "qwen3_moe": COMMON + [(L + "self_attn.q_norm", NORM), (L + "self_attn.k_norm", NORM), (L + "mlp.gate", ROUTER),
                           (L + "mlp.experts.0.gate_proj", ""), (L + "mlp.experts.127.up_proj", ""),
                           (L + "mlp.experts.5.down_proj", "")],
    "llama": COMMON + DENSE_MLP,
    "qwen2": COMMON + DENSE_MLP,
    # Qwen2-MoE's shared expert: its MLP quantizes, its sigmoid gate is a router
    "qwen2_moe": [(L + "mlp.shared_expert_gate", ROUTER), (L + "mlp.shared_expert.gate_proj", ""),
                  (L + "mlp.shared_expert.down_proj", "")],
}


@pytest.mark.parametrize("family", sorted(TABLE))
def test_the_rule_on_each_familys_module_names(family):
    for module, reason in TABLE[family]:
        assert kept_by_name(module) == reason, module


def test_unless_kept_answers_none_for_kept_modules_only():
    fmt = get_format("fp8")
    choose = unless_kept(lambda _: fmt)
    assert choose("lm_head") is None and choose(L + "mlp.gate") is None
    assert choose(L + "mlp.gate_proj") is fmt and choose(L + "mlp.experts.3.down_proj") is fmt


def _family_shapes():
    """One real shape per model_type: the family's module names, as the model builds them."""
    out = {}
    for name, cfg in SHAPES.items():
        out.setdefault(cfg.model_type, name)
    return sorted(out.values())


@pytest.mark.parametrize("shape", _family_shapes())
def test_the_model_builder_quantizes_what_the_plan_quantizes_by_name(shape):
    """A model built with "fp8 everywhere" quantizes exactly the linears plan() quantizes
    when no shape or flag keeps any (partial blocks allowed): the builder keeps the router
    and lm_head by the rule even when asked for a format everywhere."""
    cfg = shape_config(shape, 2)
    fmt = get_format("fp8")
    model = CausalLM(cfg, lambda _: fmt, dtype=torch.bfloat16, device="meta")
    built = set(model.quantized_linears())
    wrapped = CausalLM(cfg, unless_kept(lambda _: fmt), dtype=torch.bfloat16, device="meta")  # benches' random_model
    assert set(wrapped.quantized_linears()) == built
    bf16 = CausalLM(cfg, dtype=torch.bfloat16, device="meta")  # the checkpoint's tensors, every one BF16
    shapes = {n: tuple(p.shape) for n, p in bf16.named_parameters()}
    if cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
    planned = {n.removesuffix(".weight") for n in plan(shapes, fmt, PlanRules(allow_partial_blocks=True)).quantized()}
    assert built == planned
    linears = {n.removesuffix(".weight") for n, s in shapes.items() if n.endswith(".weight") and len(s) == 2}
    assert {m for m in linears - built if not kept_by_name(m)} == set()  # nothing else left BF16
    assert "lm_head" not in built and any(kept_by_name(m) == EMBEDDING for m in linears)


def _tiny_moe():
    """3 layers: 0 and 2 MoE (4 experts of 128), 1 dense with an intermediate of 328 (not a
    multiple of either block: some of its linears stay BF16)."""
    return dataclasses.replace(shape_config("qwen3-30b-a3b", 3), vocab_size=128, hidden_size=256,
                               intermediate_size=328, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, mlp_only_layers=(1,),
                               max_position_embeddings=256)


@pytest.mark.parametrize("fmt_name", ["fp8", "nvfp4"])
def test_convert_the_model_builder_the_engine_and_the_update_quantizer_agree(tmp_path, fmt_name):
    cfg = _tiny_moe()
    src = write_random_checkpoint(cfg, tmp_path / "bf16", seed=3)
    rules = dict(skip=("model.layers.0.self_attn.o_proj",), num_layers_at_end_in_bf16=1)
    done = convert_checkpoint(src, tmp_path / fmt_name, ConvertConfig(fmt_name, progress=False, **rules))
    planned = {n.removesuffix(".weight") for n in done.plan.quantized()}
    # the case is not trivial: some of every kind quantize, and each reason keeps some
    assert any(".experts." in m for m in planned) and any("self_attn" in m for m in planned)
    reasons = {d.reason for d in done.plan.kept().values()}
    assert {"router", "lm_head", "embedding", "norm", "skip-pattern", "last-layers", "partial-blocks"} <= reasons

    model, _ = load_model(done.save_dir)
    model_side = set(model.quantized_linears())
    engine = Engine(done.save_dir)
    engine_side = set(engine.quantized_layers())
    weights = random_weights(cfg, seed=4)
    update = UpdateQuantizer(engine, "cpu").quantize(weights)
    update_side = {n.removesuffix(".weight") for n, v in update.items() if isinstance(v, QuantizedTensor)}
    assert model_side == planned
    assert engine_side == planned
    assert update_side == planned
    assert not any(kept_by_name(m) for m in planned)

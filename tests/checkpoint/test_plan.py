"""plan(): kept-vs-quantized rules, fused siblings, loader name matching, NVFP4 scale groups."""

import pytest

from quantroll.checkpoint import PlanRules, plan
from quantroll.checkpoint.plan import (
    COPY,
    EMBEDDING,
    FIRST_LAYERS,
    FUSED_SIBLING,
    KEEP,
    LAST_LAYERS,
    LM_HEAD,
    NAME_COLLISION,
    NORM,
    ODD_IN_FEATURES,
    PARTIAL_BLOCKS,
    ROUTER,
    SKIP_PATTERN,
    matches_skip,
    transformers_would_skip,
)
from quantroll.formats import get_format

FP8, MX, NV = get_format("fp8"), get_format("mxfp8"), get_format("nvfp4")


def qwen3_shapes(layers=4, h=256, q=256, kv=128, inter=384, experts=0, moe_inter=128, vocab=320, bias=False):
    s = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        s |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (64,),
            p + "self_attn.k_norm.weight": (64,),
        }
        if bias:
            s[p + "self_attn.q_proj.bias"] = (q,)
        if experts:
            s[p + "mlp.gate.weight"] = (experts, h)
            for e in range(experts):
                s |= {
                    f"{p}mlp.experts.{e}.gate_proj.weight": (moe_inter, h),
                    f"{p}mlp.experts.{e}.up_proj.weight": (moe_inter, h),
                    f"{p}mlp.experts.{e}.down_proj.weight": (h, moe_inter),
                }
            s[p + "mlp.shared_expert_gate.weight"] = (1, h)
        else:
            s |= {p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter)}
    return s


def reasons(p):
    return {d.module: d.reason for d in p.decisions.values() if d.action == KEEP}


def test_default_rules_dense():
    p = plan(qwen3_shapes(), FP8)
    r = reasons(p)
    assert r["model.embed_tokens"] == EMBEDDING and r["lm_head"] == LM_HEAD and r["model.norm"] == NORM
    assert r["model.layers.0.self_attn.q_norm"] == NORM and r["model.layers.3.input_layernorm"] == NORM
    assert len(p.quantized()) == 4 * 7 and all(".self_attn." in n or ".mlp." in n for n in p.quantized())


def test_router_gates_kept_but_gate_proj_quantized():
    p = plan(qwen3_shapes(layers=2, experts=4), FP8)
    r = reasons(p)
    assert r["model.layers.0.mlp.gate"] == ROUTER and r["model.layers.1.mlp.shared_expert_gate"] == ROUTER
    assert "model.layers.0.mlp.experts.2.gate_proj.weight" in p.quantized()
    # kept 'mlp.gate' must not make a loader skip the quantized 'mlp.experts.*.gate_proj'
    skip = transformers_would_skip(p.modules_to_not_convert())
    assert not any(skip(n[: -len(".weight")]) for n in p.quantized())


def test_bias_is_copied_not_listed():
    p = plan(qwen3_shapes(layers=1, bias=True), FP8)
    d = p.decisions["model.layers.0.self_attn.q_proj.bias"]
    assert d.action == COPY and "model.layers.0.self_attn.q_proj" not in p.modules_to_not_convert()


def test_skip_patterns():
    s = qwen3_shapes()
    p = plan(s, FP8, PlanRules(skip=("mlp.down_proj", "model.layers.2.self_attn.o_proj")))
    r = reasons(p)
    assert all(r[f"model.layers.{i}.mlp.down_proj"] == SKIP_PATTERN for i in range(4))
    assert r["model.layers.2.self_attn.o_proj"] == SKIP_PATTERN and "model.layers.1.self_attn.o_proj" not in r
    assert matches_skip("model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_proj", ["model.layers.1.*"])
    assert not matches_skip("model.layers.11.mlp.up_proj.weight", "model.layers.11.mlp.up_proj", ["layers.1.*"])
    assert matches_skip("x.experts.3.up_proj.weight", "x.experts.3.up_proj", ["*.experts.*"])
    assert matches_skip("lm_head.weight", "lm_head", ["lm_head.weight"])


def test_first_and_last_layers():
    p = plan(qwen3_shapes(layers=5), FP8, PlanRules(num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=2), num_layers=5)
    r = reasons(p)
    assert r["model.layers.0.mlp.up_proj"] == FIRST_LAYERS
    assert r["model.layers.3.self_attn.q_proj"] == LAST_LAYERS and r["model.layers.4.mlp.down_proj"] == LAST_LAYERS
    assert {n.split(".")[2] for n in p.quantized()} == {"1", "2"}


@pytest.mark.parametrize("first,last", [(5, 0), (0, 5), (3, 2), (9, 9)])
def test_first_and_last_layers_covering_the_model_are_refused(first, last):
    """A conversion that would quantize nothing is a mistake in the flags, not a BF16 copy
    labelled fp8 (the probe of 2026-12-01 found it written silently)."""
    from quantroll.errors import QuantrollError

    with pytest.raises(QuantrollError, match="keep all 5 layers of the model in BF16"):
        plan(qwen3_shapes(layers=5), FP8, PlanRules(num_layers_at_start_in_bf16=first, num_layers_at_end_in_bf16=last),
             num_layers=5)
    assert plan(qwen3_shapes(layers=5), FP8, PlanRules(num_layers_at_start_in_bf16=4), num_layers=5).quantized()


def test_num_layers_inferred_from_names():
    p = plan(qwen3_shapes(layers=3), FP8, PlanRules(num_layers_at_end_in_bf16=1))
    assert {n.split(".")[2] for n in p.quantized()} == {"0", "1"}


def test_partial_blocks_and_fused_siblings():
    # q 384 (aligned) but k/v 192 (not): all of q/k/v stay BF16 for the fused qkv layer
    p = plan(qwen3_shapes(q=384, kv=192), FP8)
    r = reasons(p)
    assert r["model.layers.0.self_attn.k_proj"] == PARTIAL_BLOCKS
    assert r["model.layers.0.self_attn.q_proj"] == FUSED_SIBLING
    assert "k_proj" in p.decisions["model.layers.0.self_attn.q_proj.weight"].detail
    assert "model.layers.0.self_attn.o_proj.weight" in p.quantized()
    # the same shapes fit MXFP8 (1x32) whole: nothing kept for blocks
    assert not {m for m, why in reasons(plan(qwen3_shapes(q=384, kv=192), MX)).items() if why != NORM} - {
        "model.embed_tokens",
        "lm_head",
    }


def test_gate_up_siblings():
    p = plan(qwen3_shapes(), FP8, PlanRules(skip=("model.layers.1.mlp.up_proj",)))
    r = reasons(p)
    assert r["model.layers.1.mlp.up_proj"] == SKIP_PATTERN and r["model.layers.1.mlp.gate_proj"] == FUSED_SIBLING
    assert "model.layers.1.mlp.down_proj.weight" in p.quantized()


def test_one_kept_expert_keeps_the_layers_experts():
    s = qwen3_shapes(layers=2, experts=3)
    p = plan(s, FP8, PlanRules(skip=("model.layers.1.mlp.experts.2.down_proj",)))
    r = reasons(p)
    layer1 = [n for n in s if n.startswith("model.layers.1.mlp.experts.")]
    assert all(p.decisions[n].action == KEEP for n in layer1)
    assert all(r[n[: -len(".weight")]] == FUSED_SIBLING for n in layer1 if ".2.down_proj" not in n)
    assert "model.layers.1.mlp.experts" in p.modules_to_not_convert()  # vLLM/transformers fused module name
    assert "model.layers.0.mlp.experts.0.up_proj.weight" in p.quantized()


def test_allow_partial_blocks():
    s = {"model.layers.0.mlp.gate_proj.weight": (200, 300), "model.layers.0.mlp.up_proj.weight": (200, 300)}
    assert plan(s, FP8).quantized() == []
    assert len(plan(s, FP8, PlanRules(allow_partial_blocks=True)).quantized()) == 2


def test_nvfp4_odd_in_features_never_quantized():
    s = {"model.layers.0.self_attn.o_proj.weight": (64, 33)}
    p = plan(s, NV, PlanRules(allow_partial_blocks=True))
    assert reasons(p) == {"model.layers.0.self_attn.o_proj": ODD_IN_FEATURES}


def test_nvfp4_scale_groups():
    p = plan(qwen3_shapes(layers=1, experts=2), NV)
    groups = {tuple(sorted(n.rsplit(".", 2)[-2] for n in g)) for g in p.scale_groups}
    assert groups == {("k_proj", "q_proj", "v_proj"), ("gate_proj", "up_proj")}
    assert len(p.scale_groups) == 1 + 2  # qkv + gate/up of each expert
    assert p.scale_group_of("model.layers.0.self_attn.o_proj.weight") == ("model.layers.0.self_attn.o_proj.weight",)


def test_name_collision_is_kept():
    # 'x.weight' matches only the top-level module 'x' (patterns match whole names or dot-suffixes);
    # loaders match skip-list entries as suffixes too, so a quantized 'a.x' would be read as BF16: keep it
    p = plan({"a.x.weight": (256, 256), "x.weight": (256, 256), "a.y.weight": (256, 256)}, FP8, PlanRules(skip=("x.weight",)))
    assert reasons(p) == {"x": SKIP_PATTERN, "a.x": NAME_COLLISION}
    assert p.decisions["a.x.weight"].detail == "x" and p.quantized() == ["a.y.weight"]
    # the same through a name rule: the top-level lm_head is kept, so 'model.mtp.lm_head' is too
    p = plan({"lm_head.weight": (256, 256), "model.mtp.lm_head.weight": (256, 256)}, FP8)
    assert set(reasons(p)) == {"lm_head", "model.mtp.lm_head"}


NAMES = [
    "lm_head",
    "model.layers.1.mlp.gate",
    "model.layers.1.mlp.gate_proj",
    "model.layers.11.mlp.gate",
    "model.layers.1.mlp.experts",
    "model.layers.1.mlp.experts.0.up_proj",
    "model.mtp.lm_head",
    "model.layers.1",
]


@pytest.mark.parametrize("pattern", NAMES)
def test_transformers_matcher_replica(pattern):
    utils = pytest.importorskip("transformers.quantizers.quantizers_utils")
    ours = transformers_would_skip([pattern])
    for name in NAMES:
        assert ours(name) == (not utils.should_convert_module(name, [pattern])), (pattern, name)


def test_modules_to_not_convert_never_skips_a_quantized_module(tiny_qwen3_moe_dir, tiny_qwen3_dir):
    utils = pytest.importorskip("transformers.quantizers.quantizers_utils")
    from quantroll.checkpoint import CheckpointReader

    for d in (tiny_qwen3_dir, tiny_qwen3_moe_dir):
        with CheckpointReader(d) as r:
            shapes = {n: i.shape for n, i in r.tensors.items()}
        for fmt in (FP8, MX, NV):
            p = plan(shapes, fmt, PlanRules(skip=("model.layers.0.mlp.experts.1.up_proj",)))
            skip = p.modules_to_not_convert()
            for name in p.quantized():
                assert utils.should_convert_module(name[: -len(".weight")], skip), name
            for module in p.kept():
                assert not utils.should_convert_module(module, skip), module

"""The architecture registry: a config.json finds its family by model_type (or, without
one, by architectures), each family's block follows its rules and the config's keys, and
what quantroll cannot run is refused in one line."""

import pytest

from quantroll.errors import QuantrollError
from quantroll.model.config import config_from_dict
from quantroll.model.families.base import Block
from quantroll.model.families.registry import FAMILIES, family_for

SIZES = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def _cfg(**raw):
    return config_from_dict({**SIZES, **raw}, "ckpt/config.json")


def test_model_types_and_architectures_are_unique_across_families():
    types = [t for f in FAMILIES for t in f.model_types]
    archs = [a for f in FAMILIES for a in f.architectures]
    assert len(types) == len(set(types)) and len(archs) == len(set(archs))


@pytest.mark.parametrize("raw,want", [
    ({"model_type": "qwen3"}, Block(qk_norm=True, qkv_bias=False, o_bias=False, mlp_bias=False)),
    ({"model_type": "qwen3", "attention_bias": True}, Block(True, True, True, False)),
    ({"model_type": "qwen3", "mlp_bias": True}, Block(True, False, False, False)),  # Qwen3 has no MLP bias
    ({"model_type": "llama"}, Block(False, False, False, False)),
    ({"model_type": "llama", "attention_bias": True}, Block(False, True, True, False)),  # q/k/v AND o
    ({"model_type": "llama", "mlp_bias": True}, Block(False, False, False, True)),
    ({"model_type": "qwen2"}, Block(False, True, False, False)),  # q/k/v always, o never
    ({"model_type": "qwen2", "attention_bias": False}, Block(False, True, False, False)),
    ({"architectures": ["LlamaForCausalLM"]}, Block(False, False, False, False)),
    ({"architectures": ["Qwen2ForCausalLM"]}, Block(False, True, False, False)),
])
def test_block_follows_family_rules_and_config_keys(raw, want):
    assert _cfg(**raw).block == want


def test_family_defaults_for_omitted_keys():
    assert _cfg(model_type="llama").rope.theta == 10_000.0  # transformers' LlamaConfig default
    assert _cfg(model_type="qwen3").rope.theta == 1_000_000.0
    assert _cfg(model_type="qwen2", rope_theta=1e6).rope.theta == 1e6
    assert _cfg(architectures=["LlamaForCausalLM"]).model_type == "llama"
    assert _cfg(model_type="llama", num_experts=8, num_experts_per_tok=2).num_experts == 0  # dense family


@pytest.mark.parametrize("raw,message", [
    ({"model_type": "gpt2"}, "ckpt/config.json: model_type 'gpt2' is not supported; supported model_type values: "
                             "qwen3, qwen3_moe, llama, qwen2"),
    ({"architectures": ["MistralForCausalLM"]}, "architectures ['MistralForCausalLM'] is not supported"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window is true; quantroll runs full attention"),
    ({"model_type": "llama", "hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"model_type": "llama", "attention_bias": "yes"}, "'attention_bias' must be true or false"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "rope type 'dynamic' is not supported; supported: default, linear, yarn, llama3"),
])
def test_unsupported_configs_are_refused_in_one_line(raw, message):
    with pytest.raises(QuantrollError, match=None) as err:
        _cfg(**raw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_family_for_without_any_name():
    with pytest.raises(QuantrollError, match="no model_type .nor architectures.; an HF config.json names"):
        family_for(None, None)

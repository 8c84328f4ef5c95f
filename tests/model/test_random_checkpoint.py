"""Random checkpoints of every family: transformers loads them with no missing or unexpected
keys and computes our logits; the config.json written reads back to the same ModelConfig;
for a Qwen3 shape the weights are those of the built-in writer from the same seed."""

import dataclasses

import pytest
import torch

from quantroll.bench.shapes import SHAPES, shape_config
from quantroll.builtin import TinyQwen3, qwen3_config_dict, qwen3_weights
from quantroll.model.config import config_from_dict, config_to_dict
from quantroll.model.loader import load_model
from quantroll.model.random_checkpoint import random_weights, write_random_checkpoint

transformers = pytest.importorskip("transformers")


def _tiny(name):
    """A real shape of every family cut to 1 layer, a 128-token vocabulary and narrow widths
    (the family's block, rope variant and tying kept)."""
    c = shape_config(name, 1)
    return dataclasses.replace(c, vocab_size=128, hidden_size=96, intermediate_size=160,
                               num_attention_heads=c.num_attention_heads // c.num_key_value_heads * 2,
                               num_key_value_heads=2, head_dim=16)


DENSE = [n for n, c in SHAPES.items() if not c.num_experts]


@pytest.mark.parametrize("name", DENSE)
def test_config_round_trips(name):
    cfg = SHAPES[name]
    assert config_from_dict(config_to_dict(cfg)) == cfg


@pytest.mark.parametrize("name", DENSE)
def test_transformers_loads_each_family_and_computes_our_logits(name, tmp_path):
    cfg = _tiny(name)
    path = write_random_checkpoint(cfg, tmp_path / name, seed=1)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                                 dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(hf).__name__ == cfg.family.architectures[0]
    ours, _ = load_model(path, dtype=torch.float32)
    assert ours.config == dataclasses.replace(cfg, eos_token_ids=ours.config.eos_token_ids)
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max().item() <= 1e-4


def test_qwen3_weights_equal_the_builtin_writer():
    shape = TinyQwen3(num_hidden_layers=2)
    want = qwen3_weights(shape, seed=5)
    got = random_weights(config_from_dict(qwen3_config_dict(shape)), seed=5)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)

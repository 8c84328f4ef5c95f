"""config.json reading: every malformed value is a one-line QuantrollError naming the key
(a null, a string for a number, a size of zero, heads that do not divide, a MoE top-k
outside [1, experts], ...), and the valid spellings read as transformers reads them."""

import pytest

from quantroll.errors import QuantrollError
from quantroll.model.config import config_from_dict
from tests.conftest import TINY_QWEN3, TINY_QWEN3_MOE


def _dense(**changes):
    raw = {"model_type": "qwen3", **TINY_QWEN3, **changes}
    return {k: v for k, v in raw.items() if v is not _DROP}


def _moe(**changes):
    raw = {"model_type": "qwen3_moe", **TINY_QWEN3_MOE, **changes}
    return {k: v for k, v in raw.items() if v is not _DROP}


_DROP = object()


@pytest.mark.parametrize("raw,message", [
    (_dense(hidden_size=None), "required key 'hidden_size' is null"),
    (_dense(hidden_size=_DROP), "required key 'hidden_size' is missing"),
    (_dense(hidden_size="abc"), "'hidden_size' must be an integer, got 'abc'"),
    (_dense(hidden_size=[256]), "'hidden_size' must be an integer, got [256]"),
    (_dense(hidden_size=-256), "'hidden_size' must be an integer >= 1, got -256"),
    (_dense(num_attention_heads=0, head_dim=_DROP), "'num_attention_heads' must be an integer >= 1, got 0"),
    (_dense(num_key_value_heads=3), "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    (_dense(num_key_value_heads=8), "num_attention_heads 4 is not a multiple of num_key_value_heads 8"),
    (_dense(rms_norm_eps="tiny"), "'rms_norm_eps' must be a number, got 'tiny'"),
    (_dense(rms_norm_eps=-1.0), "'rms_norm_eps' must be a positive number, got -1.0"),
    (_dense(max_position_embeddings=0), "'max_position_embeddings' must be an integer >= 1"),
    (_dense(tie_word_embeddings="false"), "'tie_word_embeddings' must be true or false, got 'false'"),
    (_dense(eos_token_id="</s>"), "'eos_token_id' must be an integer or a list of integers, got '</s>'"),
    (_dense(eos_token_id=["<|endoftext|>"]), "'eos_token_id' must be an integer or a list of integers"),
    (_dense(rope_theta="big"), "'rope_theta' must be a number, got 'big'"),
    (_dense(rope_parameters=[1, 2]), "'rope_parameters' must be an object"),
    (_dense(rope_parameters={"rope_type": "default", "rope_theta": None, "factor": "x"}),
     "'rope_parameters.factor' must be a number"),
    (_moe(num_experts_per_tok=_DROP), "num_experts_per_tok must be in [1, num_experts = 4], got 0"),
    (_moe(num_experts_per_tok=8), "num_experts_per_tok must be in [1, num_experts = 4], got 8"),
    (_moe(moe_intermediate_size=_DROP), "required key 'moe_intermediate_size' is missing"),
    (_moe(decoder_sparse_step=0), "'decoder_sparse_step' must be an integer >= 1, got 0"),
    (_moe(mlp_only_layers=1.5), "'mlp_only_layers' must be an integer or a list of integers"),
    ([1, 2], "expected a JSON object, got list"),
])
def test_malformed_values_are_named_in_one_line(raw, message):
    with pytest.raises(QuantrollError) as err:
        config_from_dict(raw, "ckpt/config.json")
    assert str(err.value).startswith("ckpt/config.json: ") or message.startswith("num_experts") \
        or "multiple of" in message
    assert message in str(err.value)


def test_valid_spellings_read_as_transformers_writes_them():
    cfg = config_from_dict(_dense(head_dim=None, eos_token_id=[1, 2], rope_scaling=None, hidden_size=256.0))
    assert (cfg.head_dim, cfg.eos_token_ids, cfg.hidden_size) == (64, (1, 2), 256)
    cfg = config_from_dict(_dense(rope_parameters={"rope_type": "default", "rope_theta": 5e5}, eos_token_id=7))
    assert (cfg.rope.theta, cfg.eos_token_ids) == (5e5, (7,))
    moe = config_from_dict(_moe(num_experts=None, num_local_experts=4))
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_layers) == (4, 2, (0, 2))
    assert config_from_dict(_dense(num_experts_per_tok=3)).num_experts == 0  # dense: MoE keys ignored

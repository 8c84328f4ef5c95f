"""Bad checkpoints give one-line errors naming the tensor or file (found by probing the
loader, 2026-12-01): NaN/Inf weights (also values beyond BF16's range, and NaN codes or
bad scales in a block-FP8 checkpoint), float8 without a scale in any float8 dtype, a
corrupt generation_config.json or string EOS ids; and a tied checkpoint that also stores
its (equal) lm_head loads as transformers loads it."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.engine import Engine
from quantroll.errors import NonFiniteError, QuantrollError
from tests.conftest import copy_editing_config, copy_editing_tensors


def test_non_finite_bf16_weights_are_named(tiny_qwen3_dir, tmp_path):
    name = "model.layers.0.mlp.down_proj.weight"

    def nan(t):
        t[name][0, 0] = float("nan")

    with pytest.raises(NonFiniteError, match=rf"tensor '{name}' holds NaN/Inf values"):
        Engine(copy_editing_tensors(tiny_qwen3_dir, tmp_path / "nan", nan))

    def huge(t):  # finite in float64, inf once cast to the engine's bfloat16
        t["model.norm.weight"] = t["model.norm.weight"].double()
        t["model.norm.weight"][3] = 1e300

    with pytest.raises(NonFiniteError, match=r"'model.norm.weight' holds NaN/Inf values \(or values beyond bfloat16"):
        Engine(copy_editing_tensors(tiny_qwen3_dir, tmp_path / "huge", huge))


def test_float8_without_a_scale_is_refused_in_every_float8_dtype(tiny_qwen3_dir, tmp_path):
    name = "model.layers.1.self_attn.o_proj.weight"

    def e5m2(t):
        t[name] = t[name].to(torch.float8_e5m2)

    with pytest.raises(QuantrollError, match=rf"'{name}' is stored as torch.float8_e5m2 without a scale"):
        Engine(copy_editing_tensors(tiny_qwen3_dir, tmp_path / "e5m2", e5m2))


@pytest.fixture(scope="module")
def fp8_source(tiny_qwen3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8") / "ckpt"
    convert_checkpoint(tiny_qwen3_dir, out, ConvertConfig(format="fp8", allow_partial_blocks=True, progress=False))
    return out


@pytest.mark.parametrize("bad,what", [("nan-scale", "NaN/Inf scales"), ("inf-scale", "NaN/Inf scales"),
                                      ("negative-scale", "negative scales"), ("nan-code", "NaN element codes")])
def test_corrupt_block_fp8_tensors_are_named(fp8_source, tmp_path, bad, what):
    module = "model.layers.0.mlp.up_proj"
    shards = sorted(fp8_source.glob("*.safetensors"))
    assert len(shards) == 1
    shutil.copytree(fp8_source, tmp_path / bad)
    path = tmp_path / bad / shards[0].name
    tensors = load_file(path)
    scale = tensors[f"{module}.weight_scale_inv"]
    if bad == "nan-code":
        codes = tensors[f"{module}.weight"].view(torch.uint8).clone()
        codes[1, 2] = 0x7F
        tensors[f"{module}.weight"] = codes.view(torch.float8_e4m3fn)
    else:
        scale[0, 0] = {"nan-scale": float("nan"), "inf-scale": float("inf"), "negative-scale": -1.0}[bad]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(NonFiniteError, match=rf"tensor '{module}.weight' holds {what}; the checkpoint is corrupt"):
        Engine(tmp_path / bad)


def test_generation_config_problems_are_named(tiny_qwen3_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen3_dir, broken)
    (broken / "generation_config.json").write_text("{bad")
    with pytest.raises(QuantrollError, match="generation_config.json is not valid JSON"):
        Engine(broken)
    (broken / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(QuantrollError, match="'eos_token_id' must be an integer or a list of integers, got '</s>'"):
        Engine(broken)


def test_a_tied_checkpoint_may_store_its_lm_head_if_it_equals_the_embedding(tiny_qwen3_dir, tmp_path):
    def tie(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()

    tied = copy_editing_tensors(tiny_qwen3_dir, tmp_path / "tied-src", tie)
    tied = copy_editing_config(tied, tmp_path / "tied", lambda cfg: cfg.update(tie_word_embeddings=True))
    engine = Engine(tied)
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()

    def untie(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"] * 2

    other = copy_editing_tensors(tiny_qwen3_dir, tmp_path / "other-src", untie)
    other = copy_editing_config(other, tmp_path / "other", lambda cfg: cfg.update(tie_word_embeddings=True))
    with pytest.raises(QuantrollError, match="stored lm_head.weight differs from model.embed_tokens.weight"):
        Engine(other)


def test_a_quantized_checkpoint_without_its_quantization_config_says_so(fp8_source, tmp_path):
    bare = copy_editing_config(fp8_source, tmp_path / "bare", lambda cfg: cfg.pop("quantization_config"))
    with pytest.raises(QuantrollError, match="config.json has no quantization_config"):
        Engine(bare)


@pytest.mark.parametrize("change,message", [
    ({"weight_block_size": 128}, "weight_block_size must be a list like"),
    ({"quantroll": "yes"}, "quantization_config.quantroll must be an object"),
    ({"quantroll": {"num_layers_at_start_in_bf16": "x"}}, "num_layers_at_start_in_bf16' must be an integer"),
])
def test_malformed_quantization_config_values_are_named(fp8_source, tmp_path, change, message):
    bad = copy_editing_config(fp8_source, tmp_path / "bad", lambda cfg: cfg["quantization_config"].update(change))
    with pytest.raises(QuantrollError, match=message):
        Engine(bad)

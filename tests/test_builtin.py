"""The built-in tiny checkpoint is a real Qwen3 checkpoint: transformers loads it whole."""

import pytest
import torch

from quantroll.builtin import TinyQwen3, write_tiny_qwen3

transformers = pytest.importorskip("transformers")


def test_transformers_loads_builtin_checkpoint_with_no_missing_keys(tmp_path):
    path = write_tiny_qwen3(tmp_path / "tiny")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert type(model).__name__ == "Qwen3ForCausalLM"
    logits = model(torch.tensor([[1, 5, 9]])).logits
    assert logits.shape == (1, 3, TinyQwen3().vocab_size) and torch.isfinite(logits).all()


def test_builtin_checkpoint_is_reproducible(tmp_path):
    a = (write_tiny_qwen3(tmp_path / "a") / "model.safetensors").read_bytes()
    b = (write_tiny_qwen3(tmp_path / "b") / "model.safetensors").read_bytes()
    assert a == b


def test_builtin_checkpoint_carries_the_character_tokenizer(tmp_path):
    import json

    from tokenizers import Tokenizer

    from quantroll.tasks.tokenizer import EOS, char_vocab

    path = write_tiny_qwen3(tmp_path / "tiny")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tok.decode(tok.encode("7*6=42").ids) == "7*6=42"
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["eos_token_id"] == char_vocab()[EOS] and cfg["vocab_size"] >= len(char_vocab())


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4"])
def test_shipped_models_quantize_every_decoder_linear(kind, fmt):
    """convert's own plan on the shipped checkpoint: every q/k/v/o, gate/up/down (and expert)
    projection is quantized; only embedding, lm_head, norms and router gates stay BF16."""
    from quantroll.builtin import builtin_checkpoint
    from quantroll.checkpoint.plan import plan
    from quantroll.checkpoint.reader import CheckpointReader
    from quantroll.formats import get_format

    with CheckpointReader(builtin_checkpoint(kind)) as reader:
        shapes = {name: info.shape for name, info in reader.tensors.items()}
    p = plan(shapes, get_format(fmt))
    projections = {n[: -len(".weight")] for n, s in shapes.items() if n.endswith("_proj.weight") and len(s) == 2}
    assert len(projections) == (28 if kind == "dense" else 4 * (4 + 3 * 8))
    assert {n[: -len(".weight")] for n in p.quantized()} == projections
    assert {d.reason for d in p.kept().values()} == ({"embedding", "lm_head", "norm"} | ({"router"} if kind == "moe"
                                                                                          else set()))


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_shipped_models_have_whole_128_blocks_and_a_power_of_two_head_dim(kind):
    import json

    from quantroll.builtin import builtin_checkpoint

    cfg = json.loads((builtin_checkpoint(kind) / "config.json").read_text())
    head_dim = cfg["head_dim"]
    assert head_dim & (head_dim - 1) == 0 and head_dim % 128 == 0
    dims = [cfg["hidden_size"], cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim,
            cfg.get("moe_intermediate_size") if kind == "moe" else cfg["intermediate_size"]]
    assert all(d % 128 == 0 for d in dims), dims

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

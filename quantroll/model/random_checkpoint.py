"""A random-weight BF16 HF checkpoint of any family and size, with quantroll's character
tokenizer: what benches at real sizes and tests of every family run on (nothing is
downloaded). Weights are drawn N(0, 0.02) in the model's parameter order (norms 1), which
for a Qwen3 shape is the order ``builtin.qwen3_weights`` draws, so both write the same
tensors from the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from quantroll.model.causal_lm import CausalLM
from quantroll.model.config import ModelConfig, config_to_dict
from quantroll.tasks.tokenizer import BOS, EOS, PAD, char_vocab, write_char_tokenizer


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """BF16 tensors under the checkpoint's names (a tied lm_head is not stored)."""
    g = torch.Generator().manual_seed(seed)
    model = CausalLM(cfg, dtype=torch.bfloat16, device="meta")
    out = {}
    for name, p in model.named_parameters():  # a tied lm_head is the embedding: named once
        if "norm" in name:
            out[name] = torch.ones(p.shape, dtype=torch.bfloat16)
        else:
            out[name] = (torch.randn(*p.shape, generator=g) * 0.02).to(torch.bfloat16)
    return out


def write_random_checkpoint(cfg: ModelConfig, directory: str | Path, seed: int = 0) -> Path:
    """config.json (the family's, ``config_to_dict``), generation_config.json, the character
    tokenizer and model.safetensors at ``directory`` (created); returns its path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    vocab = char_vocab()
    raw = {**config_to_dict(cfg), "bos_token_id": vocab[BOS], "eos_token_id": vocab[EOS]}
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    ids = {"bos_token_id": vocab[BOS], "eos_token_id": vocab[EOS], "pad_token_id": vocab[PAD]}
    (out / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
    write_char_tokenizer(out)
    save_file(random_weights(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out

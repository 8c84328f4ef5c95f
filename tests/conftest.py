"""Shared fixtures: tiny random Qwen3 and Qwen3-MoE checkpoints written by transformers.

The checkpoints are real ``save_pretrained`` output (bf16, config.json,
generation_config.json, a small byte-level BPE tokenizer), so everything that reads
HF directories can be tested on them. Dimensions mix multiples of 128 with
non-multiples on purpose:

  dense  (TINY_QWEN3):  hidden 256, 4 layers, 4 heads x head_dim 96, 2 KV heads,
         intermediate 384, vocab 320, untied lm_head.
         q_proj [384, 256] (128-aligned), k/v_proj [192, 256] (not), o_proj [256, 384],
         gate/up [384, 256], down [256, 384].
  moe    (TINY_QWEN3_MOE): hidden 256, 3 layers (layer 1 dense MLP), 4 heads x 64,
         2 KV heads, 4 experts top-2 with moe_intermediate 128, dense intermediate 320,
         vocab 320. q/k/v/o and experts 128-aligned; the dense MLP [320, 256]/[256, 320] not.

Use the session fixtures (``tiny_qwen3_dir``, ``tiny_qwen3_sharded_dir``,
``tiny_qwen3_moe_dir``, ``tiny_qwen3_moe_sharded_dir``) read-only, or call
``write_tiny_qwen3(path, ...)`` / the ``tiny_checkpoint`` factory for a variant.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

TINY_QWEN3 = dict(
    vocab_size=320,
    hidden_size=256,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=96,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
TINY_QWEN3_MOE = dict(
    vocab_size=320,
    hidden_size=256,
    intermediate_size=320,
    moe_intermediate_size=128,
    num_hidden_layers=3,
    mlp_only_layers=[1],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    num_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
SHARD_SIZE = "300KB"  # splits both tiny models into several shards


def write_tiny_tokenizer(path: Path, vocab_size: int = 300) -> None:
    """A byte-level BPE tokenizer trained on a few sentences (no download), saved as HF files."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    text = ["The quick brown fox jumps over the lazy dog. 1 + 2 = 3; 12 * 7 = 84."] * 8
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(text, vocab_size=vocab_size, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.save_pretrained(str(path))


def write_tiny_qwen3(
    path: str | Path,
    *,
    moe: bool = False,
    max_shard_size: str | int | None = None,
    seed: int = 0,
    tokenizer: bool = True,
    **overrides,
) -> Path:
    """Write a random-init bf16 Qwen3 (or Qwen3-MoE) HF directory at ``path`` and return it.

    ``max_shard_size`` (e.g. "300KB") shards it with an index; ``overrides`` change
    config fields of TINY_QWEN3 / TINY_QWEN3_MOE.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    path = Path(path)
    torch.manual_seed(seed)
    if moe:
        config = Qwen3MoeConfig(**{**TINY_QWEN3_MOE, **overrides})
        model = Qwen3MoeForCausalLM(config)
    else:
        config = Qwen3Config(**{**TINY_QWEN3, **overrides})
        model = Qwen3ForCausalLM(config)
    model = model.to(torch.bfloat16)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(path), **kwargs)
    if tokenizer:
        write_tiny_tokenizer(path)
    return path


def copy_editing_tensors(src: Path, dst: Path, edit) -> Path:
    """A copy of single-shard checkpoint ``src`` at ``dst`` after edit(tensors) on its model.safetensors."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def copy_editing_config(src: Path, dst: Path, edit) -> Path:
    """A copy of checkpoint ``src`` at ``dst`` after edit(config) on its config.json (a dict, edited in place)."""
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def read_config(path: str | Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Factory: ``tiny_checkpoint(moe=False, sharded=False, **overrides) -> Path`` (cached, read-only)."""
    cache: dict[tuple, Path] = {}

    def make(moe: bool = False, sharded: bool = False, **overrides) -> Path:
        key = (moe, sharded, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in cache:
            name = f"{'qwen3moe' if moe else 'qwen3'}{'-sharded' if sharded else ''}-{len(cache)}"
            cache[key] = write_tiny_qwen3(
                tmp_path_factory.mktemp("ckpt") / name, moe=moe, max_shard_size=SHARD_SIZE if sharded else None, **overrides
            )
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint()


@pytest.fixture(scope="session")
def tiny_qwen3_sharded_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint(sharded=True)


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint(moe=True)


@pytest.fixture(scope="session")
def tiny_qwen3_moe_sharded_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint(moe=True, sharded=True)

"""A character-level tokenizer for the built-in tasks, saved as an HF ``tokenizer.json``.

Every printable ASCII character is one token, so arithmetic is spelled digit by
digit (a tiny model learns carries far more easily than over multi-digit BPE tokens),
and the file loads with the ``tokenizers`` library like any checkpoint's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

PAD, EOS, BOS = "<|pad|>", "<|endoftext|>", "<|bos|>"
SPECIALS = (PAD, EOS, BOS)
CHARS = tuple(chr(c) for c in range(32, 127))


def char_vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate(SPECIALS + CHARS)}


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = char_vocab()
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIALS))
    return tok


def write_char_tokenizer(directory: str | Path) -> None:
    """tokenizer.json plus the small config files transformers expects."""
    import json

    out = Path(directory)
    build_char_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": PAD, "bos_token": BOS,
        "model_max_length": 2048, "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")

"""A character-level tokenizer for the built-in tasks, saved as an HF ``tokenizer.json``.

Every printable ASCII character is one token, so arithmetic is spelled digit by
digit (a tiny model learns carries far more easily than over multi-digit BPE tokens),
and the file loads with the ``tokenizers`` library like any checkpoint's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from quantroll.errors import QuantrollError

PAD, EOS, BOS = "<|pad|>", "<|endoftext|>", "<|bos|>"
SPECIALS = (PAD, EOS, BOS)
CHARS = tuple(chr(c) for c in range(32, 127))
# The line break, added after every id the shipped checkpoints were trained with (ids 0-97
# unchanged, so their tokenizer.json and outputs stay as they were): long traces (tasks/trace.py)
# are written a line at a time.
LINE = "\n"
EXTRA = (LINE,)


def char_vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate(SPECIALS + CHARS + EXTRA)}


_VOCAB = char_vocab()
_INVERSE = {i: t for t, i in _VOCAB.items()}


def encode(text: str) -> list[int]:
    """Character token ids of ``text`` (what the checkpoint's tokenizer.json gives)."""
    try:
        return [_VOCAB[c] for c in text]
    except KeyError as err:
        raise QuantrollError(f"character {err.args[0]!r} of {text!r} is not in the character tokenizer") from None


def decode(ids: list[int]) -> str:
    """Text of token ids; special tokens spelled out (EOS as ``<|endoftext|>``)."""
    return "".join(_INVERSE.get(i, "") for i in ids)


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = char_vocab()
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIALS))
    return tok


def write_char_tokenizer(directory: str | Path, max_length: int = 2048) -> None:
    """tokenizer.json plus the small config files transformers expects (``max_length``:
    the model's context, transformers' model_max_length)."""
    import json

    out = Path(directory)
    build_char_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": PAD, "bos_token": BOS,
        "model_max_length": max_length, "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")


def first_unknown(tokenizer, text: str) -> str | None:
    """The first character (or piece) of ``text`` that ``tokenizer`` (a ``tokenizers``
    Tokenizer) has no token for and would silently turn into its unknown token (the
    character tokenizer's is the pad token), or None. Tokenizers without an unknown
    token (byte-level BPE spells any text) never have one."""
    unk = getattr(tokenizer.model, "unk_token", None)
    unk_id = tokenizer.token_to_id(unk) if unk else None
    if unk_id is None:
        return None
    encoding = tokenizer.encode(text, add_special_tokens=False)
    for token_id, (start, end) in zip(encoding.ids, encoding.offsets):
        if token_id == unk_id and text[start:end] != unk:
            return text[start:end]
    return None


def load_tokenizer(checkpoint: Path):
    """The checkpoint's ``tokenizer.json`` (any HF tokenizer the ``tokenizers`` library
    reads); a missing file is a one-line error naming it."""
    path = Path(checkpoint) / "tokenizer.json"
    if not path.is_file():
        raise QuantrollError(f"{path} not found; the checkpoint needs its tokenizer.json")
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))

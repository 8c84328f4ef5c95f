"""The one reader of the files a person gives quantroll: text, JSON and JSON Lines.

Every file that a user may have written, edited, truncated or mixed up (config.json,
prompt data, a metrics file, the records of a trainer-state save) is read here, so every
way it can be wrong ends in the same kind of line: the file (and line), what is wrong
(missing, a directory, unreadable, not UTF-8, not JSON, not the expected type) and what
to do. Reading is strict UTF-8, and the data stays data: nothing read here is unpickled,
evaluated or imported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from quantroll.errors import QuantrollError

_KINDS = {dict: "a JSON object", list: "a JSON list", str: "a string", int: "an integer", float: "a number"}


def kind_of(value) -> str:
    """How to name a JSON value's type to a user ('null', 'a number', ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def read_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of the file ``what`` names; one line for missing, a directory, unreadable."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise QuantrollError(f"{what} {p} not found") from None
    except IsADirectoryError:
        raise QuantrollError(f"{what} {p} is a directory; give a file") from None
    except OSError as err:
        raise QuantrollError(f"cannot read {what} {p}: {err.strerror}") from None


def decode_utf8(raw: bytes, path: str | Path, what: str) -> str:
    """``raw`` as UTF-8 text, or one line naming the first bad byte and its line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise QuantrollError(f"{what} {path} is not UTF-8 text (byte 0x{raw[err.start]:02x} on line {line}); "
                             "save it as UTF-8") from None


def read_text(path: str | Path, what: str) -> str:
    """A UTF-8 text file (a leading byte-order mark is dropped)."""
    text = decode_utf8(read_bytes(path, what), path, what)
    return text[1:] if text.startswith("\ufeff") else text


def parse_json(text: str, where: str, fix: str):
    """One JSON value from ``text``; ``where`` names it in the error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise QuantrollError(f"{where} is not valid JSON ({err.msg}, line {err.lineno}); {fix}") from None
    except RecursionError:
        raise QuantrollError(f"{where} nests too deeply to be read; {fix}") from None


def read_json(path: str | Path, what: str, expect: type = dict, fix: str = "fix or re-create it"):
    """The JSON value of a file, which must be of type ``expect`` (a dict by default)."""
    value = parse_json(read_text(path, what), f"{what} {path}", fix)
    if expect is not None and not isinstance(value, expect):
        raise QuantrollError(f"{what} {path} holds {kind_of(value)}, not {_KINDS.get(expect, expect.__name__)}; {fix}")
    return value


def iter_jsonl(path: str | Path, what: str, fix: str = "fix the line") -> Iterator[tuple[int, object]]:
    """(line number, value) for every non-blank line of a JSON Lines file; a line that is
    not JSON is an error naming ``path:line``."""
    text = read_text(path, what)
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield number, parse_json(line, f"{path}:{number}", fix)


def json_field(row: dict, key: str, where: str, expect: type, flag: str | None = None):
    """``row[key]``, which must be present and of type ``expect`` (bool is no number);
    ``flag`` names the option that chose ``key``."""
    hint = f" (set {flag})" if flag else ""
    if key not in row:
        keys = ", ".join(sorted(map(repr, row))[:6]) or "none"
        raise QuantrollError(f"{where} lacks {key!r}{hint}; its keys: {keys}")
    value = row[key]
    if not isinstance(value, expect) or (isinstance(value, bool) and expect is not bool):
        raise QuantrollError(f"{where}: {key!r} is {kind_of(value)}, not {_KINDS.get(expect, expect.__name__)}"
                             f"{' (' + repr(value)[:40] + ')' if value is not None else ''}")
    return value

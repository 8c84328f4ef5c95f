"""The metrics file across runs: a fresh run starts it, a resumed run continues it.

- A fresh run needs the file absent or empty. A file that holds steps is the record of
  a run, so it is not overwritten silently: resume that run (``--load``), overwrite
  it (``--force``) or choose another file. ``--force`` replaces only a file quantroll
  wrote, recognised by its first line: a JSON object with an integer ``step`` and a
  string ``rollout_precision`` (every step record the loop writes has both; see
  ``is_quantroll_metrics``). Any other file is the user's: refused, --force or not.
- A run resumed after step S keeps the lines of steps <= S byte for byte and drops
  later ones (written after the last save, before a crash), rewriting the file with the
  atomic writer: killed during the rewrite, the file is the old one or the new one.
- A last line that is not a whole record (a crash or a full disk mid-write) is dropped
  with a note. A damaged line anywhere else is not a crash's doing: refused, naming
  the file and line.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantroll import durable
from quantroll.errors import QuantrollError
from quantroll.inputs import read_bytes


def _records(path: Path, flag: str) -> tuple[list[tuple[int, bytes, dict]], str | None]:
    """([(line number, raw line, record)], note about a dropped last line or None)."""
    raw = read_bytes(path, flag)
    lines = raw.split(b"\n")
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
    out, note = [], None
    for k, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line.decode("utf-8"))
            if not isinstance(record, dict) or not isinstance(record.get("step"), int) or record["step"] < 0:
                raise ValueError("not a step record")
        except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            if k == len(numbered) - 1:
                note = f"{flag} {path}: dropped its damaged last line {number} (a write cut off by a crash?)"
                continue
            reason = "not UTF-8" if isinstance(err, UnicodeDecodeError) else "not a metrics record"
            raise QuantrollError(f"{flag} {path}:{number} is {reason}; fix or delete that line, or start over "
                                 "with --force") from None
        out.append((number, line, record))
    return out, note


def is_quantroll_metrics(raw: bytes) -> bool:
    """Whether ``raw`` (a file's bytes) starts as a metrics file quantroll wrote: its first
    non-blank line is a step record (an object with an integer "step" and a string
    "rollout_precision")."""
    first = next((line for line in raw.split(b"\n") if line.strip()), b"")
    try:
        record = json.loads(first.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("step"), int) \
        and not isinstance(record["step"], bool) and isinstance(record.get("rollout_precision"), str)


def check_fresh(path: str | Path | None, force: bool, flag: str = "--metrics-file") -> None:
    """A fresh run may write ``path``: absent, empty, or a quantroll metrics file with ``force``."""
    if not path:
        return
    p = Path(path)
    raw = read_bytes(p, flag) if p.is_file() else b""
    if not raw.strip():
        return
    if not is_quantroll_metrics(raw):
        raise QuantrollError(f"{flag} {p} is not a metrics file quantroll wrote (its first line is not a step "
                             "record); quantroll never replaces it, --force or not: choose another file")
    if not force:
        raise QuantrollError(f"{flag} {p} already holds the metrics of a run; resume that run with --load, pass "
                             "--force to overwrite it, or choose another file")


def continue_after(path: str | Path | None, last_step: int, log=print, flag: str = "--metrics-file") -> None:
    """Keep the lines of steps <= ``last_step`` (the resumed save's), drop the rest."""
    if not path or not Path(path).is_file():
        return
    p = Path(path)
    records, note = _records(p, flag)
    if note:
        log(note)
    kept = [(line, r) for _, line, r in records if r["step"] <= last_step]
    steps = [r["step"] for _, r in kept]
    if steps != list(range(last_step + 1)):
        log(f"{flag} {p}: note: it holds {len(set(steps))} of the {last_step + 1} steps up to the resumed step "
            f"{last_step}; the resumed run appends after them")
    if len(kept) == len(records) and note is None and p.read_bytes().endswith(b"\n"):
        return  # nothing to drop: leave the file untouched
    with durable.writing(f"{flag} {p}"):
        durable.write_atomic(p, b"".join(line + b"\n" for line, _ in kept))

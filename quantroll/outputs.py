"""Checks of the paths a command will write, made before its work: a path it could not
write fails at once, in one line naming the flag, not after the work is done."""

from __future__ import annotations

from pathlib import Path

from quantroll.errors import QuantrollError


def check_output_path(flag: str, value: str, *, is_file: bool) -> None:
    """``value`` can be created or replaced as a file (``is_file``) or a directory: its
    parent directory exists, and it is not already the other kind."""
    path = Path(value)
    parent = path.resolve().parent
    if not parent.is_dir():
        raise QuantrollError(f"{flag} {value}: {parent} is not a directory; create it first")
    if is_file and path.is_dir():
        raise QuantrollError(f"{flag} {value} is a directory; give a file path")
    if not is_file and path.exists() and not path.is_dir():
        raise QuantrollError(f"{flag} {value} is a file; give a directory path")

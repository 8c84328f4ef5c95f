"""Checks of the paths a command will write, made before its work: a path it could not
write fails at once, in one line naming the flag, not after the work is done.

"Could not write" is tried, not guessed from permission bits (a read-only filesystem,
or a user for whom the bits do not apply, root, would pass those): a hidden probe file
is created in the directory that will hold the output and removed again.
"""

from __future__ import annotations

import os
from pathlib import Path

from quantroll import durable
from quantroll.errors import QuantrollError


def _probe(flag: str, value: str, directory: Path) -> None:
    """Create and remove a file in ``directory``; one line naming the flag if that fails."""
    probe = durable.temp_name(directory / "quantroll-write-test", "tmp")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as err:
        raise QuantrollError(f"{flag} {value}: cannot write in {directory} ({durable.advice(err)})") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def _nearest_existing(path: Path) -> Path:
    for p in [path, *path.parents]:
        if p.exists() or p.is_symlink():
            return p
    return Path("/")


def check_output_path(flag: str, value: str, *, is_file: bool) -> None:
    """``value`` can be created or replaced as a file (``is_file``) or a directory: its
    parent directory exists and can be written, and it is not already the other kind."""
    path = Path(value)
    parent = path.absolute().parent
    if not parent.is_dir():
        above = _nearest_existing(parent)
        if above.exists() and not above.is_dir():
            raise QuantrollError(f"{flag} {value}: {above} is a file, not a directory; choose another path")
        raise QuantrollError(f"{flag} {value}: {parent} is not a directory; create it first")
    if is_file and path.is_dir():
        raise QuantrollError(f"{flag} {value} is a directory; give a file path")
    if not is_file and path.exists() and not path.is_dir():
        raise QuantrollError(f"{flag} {value} is a file; give a directory path")
    _probe(flag, value, path if (not is_file and path.is_dir()) else parent)


def check_output_dir(flag: str, value: str) -> None:
    """``value`` is a directory that exists or can be created with its parents: nothing
    on the way is a file, and the nearest existing directory can be written."""
    path = Path(value).absolute()
    above = _nearest_existing(path)
    if not above.is_dir():
        what = f"{value} is a file" if above == path else f"{above} is a file, not a directory"
        raise QuantrollError(f"{flag} {value}: {what}; give a directory path")
    _probe(flag, value, above)

"""Create an output directory all at once or not at all.

A converter that dies halfway (NaN in layer 40, disk full, Ctrl-C) must not leave a
directory that looks like a checkpoint: an engine would load it and fail later, or
worse, load a mix. So output goes to a hidden temporary directory beside the
destination (same filesystem, so ``rename`` is atomic) and is renamed into place
only after everything is written. Replacing an existing destination (``force``)
renames the old one aside first, renames the new one in, then deletes the old: at
every instant the destination path is either the complete old or the complete new
directory, except for the moment between the two renames, when it is absent.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quantroll.errors import QuantrollError


def check_destination(dst: Path, force: bool) -> None:
    """Refuse an existing destination unless ``force``; refuse a non-directory always."""
    if dst.exists() or dst.is_symlink():
        if not dst.is_dir() or dst.is_symlink():
            raise QuantrollError(f"destination {dst} exists and is not a directory; choose another --save-dir")
        if not force:
            raise QuantrollError(f"destination {dst} already exists; choose another --save-dir or pass --force to replace it")


def _make_parents(parent: Path) -> list[Path]:
    """mkdir -p, returning the directories it created (deepest last)."""
    created = []
    for p in reversed([parent, *parent.parents]):
        if not p.exists():
            try:
                p.mkdir()
            except OSError as err:
                raise QuantrollError(f"cannot create directory {p}: {err.strerror}") from None
            created.append(p)
    return created


@contextmanager
def atomic_directory(dst: str | Path, force: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory that becomes ``dst`` when the block succeeds.

    On any exception (including KeyboardInterrupt) the temporary directory and any
    parent directories created for it are removed, and ``dst`` is left as it was.
    """
    dst = Path(dst).absolute()
    check_destination(dst, force)
    created = _make_parents(dst.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    except OSError as err:
        _remove_empty(created)
        raise QuantrollError(f"cannot write in {dst.parent}: {err.strerror}") from None
    try:
        yield tmp
        _move_into_place(tmp, dst, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise


def _move_into_place(tmp: Path, dst: Path, force: bool) -> None:
    check_destination(dst, force)  # it may have appeared while we were writing
    old = None
    if dst.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.rmdir(old)
        os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except OSError as err:
        if old is not None:
            os.rename(old, dst)
        raise QuantrollError(f"cannot move the finished output into {dst}: {err.strerror}") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_empty(dirs: list[Path]) -> None:
    for d in reversed(dirs):
        try:
            d.rmdir()
        except OSError:
            break


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a small text file so that a reader sees the old or the new content, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

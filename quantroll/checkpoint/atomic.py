"""Create an output directory all at once or not at all.

A converter that dies halfway (NaN in layer 40, disk full, Ctrl-C) must not leave a
directory that looks like a checkpoint: an engine would load it and fail later, or
worse, load a mix. So output goes to a hidden temporary directory beside the
destination (same filesystem, so ``rename`` is atomic) and is renamed into place
only after everything is written. Replacing an existing destination (``force``)
swaps the two directories in one ``renameat2(RENAME_EXCHANGE)`` where Linux offers
it, so the destination path is at every instant the complete old or the complete new
directory; elsewhere the old one is renamed aside first (absent for the moment
between the two renames). Temporary names carry the writer's pid
(``.NAME.partial-PID-XXXXXXXX``): those of a writer that was killed are removed the
next time the same destination is written. Every file and directory written gets the
umask's permissions (``tempfile.mkdtemp`` alone would make the directory 0700, and
safetensors writes 0600 files).

What may be replaced is quantroll/outputs.py's rule: an existing destination only with
``force`` and only when quantroll wrote every file in it; so each directory written
here gets the marker (``.quantroll``) that lists its files.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quantroll import durable, outputs
from quantroll.errors import QuantrollError


def check_destination(dst: Path, force: bool, what: str | None = None) -> None:
    """The replace rule of quantroll/outputs.py for ``dst`` (``what`` names it: "--save-dir out")."""
    outputs.check_replace(what or f"destination {dst}", dst, force)


def _make_parents(parent: Path) -> list[Path]:
    """mkdir -p, returning the directories it created (deepest last)."""
    try:
        return durable.make_dirs(parent)
    except OSError as err:
        raise QuantrollError(f"cannot create directory {err.filename or parent}: "
                             f"{durable.advice(err)}") from None


@contextmanager
def atomic_directory(dst: str | Path, force: bool = False, what: str | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory that becomes ``dst`` when the block succeeds,
    with the marker listing what the block wrote. ``what`` names ``dst`` in messages.

    On any exception (including KeyboardInterrupt) the temporary directory and any
    parent directories created for it are removed, and ``dst`` is left as it was; an
    OSError (a full disk, a read-only filesystem) becomes one QuantrollError naming ``dst``.
    """
    dst = Path(dst).absolute()
    what = what or f"destination {dst}"
    check_destination(dst, force, what)
    created = _make_parents(dst.parent)
    for stale in durable.stale_temps(dst.parent, dst.name):  # left by a killed writer of dst
        durable.remove(stale)
    try:
        tmp = durable.make_temp_dir(dst)
    except OSError as err:
        durable.remove_empty(created)
        raise QuantrollError(f"cannot write in {dst.parent}: {durable.advice(err)}") from None
    try:
        with durable.writing(str(dst)):
            yield tmp
            durable.follow_umask(tmp)
            outputs.write_marker(tmp)
            _move_into_place(tmp, dst, force, what)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        durable.remove_empty(created)
        raise


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically (Linux renameat2 RENAME_EXCHANGE); False
    where the system or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _move_into_place(tmp: Path, dst: Path, force: bool, what: str) -> None:
    check_destination(dst, force, what)  # it may have appeared, or changed, while we were writing
    if dst.exists() and _exchange(tmp, dst):  # tmp now holds the old directory
        durable.fsync_dir(dst.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = None
    if dst.exists():
        old = durable.temp_name(dst, "old")
        os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except OSError as err:
        if old is not None:
            os.rename(old, dst)
        raise QuantrollError(f"cannot move the finished output into {dst}: {err.strerror}") from None
    durable.fsync_dir(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a small text file so that a reader sees the old or the new content, never half."""
    durable.write_atomic(path, text)

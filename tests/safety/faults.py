"""Filesystem faults a test can inject under one directory, in this process.

Tests run as root in CI, where permission bits stop nothing, and cannot mount a
read-only or a full filesystem; so the faults are made where Python reaches the OS:
``open`` (builtins and io), ``os.open``, ``os.mkdir``, ``os.rename`` and ``os.replace``.

- ``read_only(root)``: creating, writing, renaming or making a directory under
  ``root`` fails with EROFS, as on a read-only mount; reading works.
- ``disk_full(root, budget)``: files opened for writing under ``root`` accept
  ``budget`` bytes in all, then every write fails with ENOSPC (what fits is written
  first, as a real full disk does).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
from contextlib import contextmanager
from pathlib import Path

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _under(path, root: str) -> bool:
    if isinstance(path, int):
        return False
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    full = os.path.abspath(text)
    return full == root or full.startswith(root + os.sep)


def _fail(code: int, path) -> None:
    raise OSError(code, os.strerror(code), os.fsdecode(os.fspath(path)))


class _Budget:
    def __init__(self, size: int):
        self.left = size


class _FullFile:
    """A writable file that takes bytes from a shared budget and then fails with ENOSPC."""

    def __init__(self, f, budget: _Budget, path):
        self._f, self._budget, self._path = f, budget, path

    def write(self, data):
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > self._budget.left:
            fits = self._budget.left
            if fits:
                self._f.write(data[:fits])
            self._budget.left = 0
            _fail(errno.ENOSPC, self._path)
        self._budget.left -= size
        return self._f.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


@contextmanager
def _patched(root: Path, open_hook, os_open_hook, dir_hook):
    root_s = os.path.abspath(str(root))
    real_open, real_os_open = builtins.open, os.open
    real_mkdir, real_rename, real_replace = os.mkdir, os.rename, os.replace

    def fake_open(file, mode="r", *args, **kwargs):
        writing = any(c in mode for c in "wax+")
        if writing and _under(file, root_s):
            return open_hook(real_open, file, mode, *args, **kwargs)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & _WRITE_FLAGS and _under(path, root_s):
            os_open_hook(path)
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    def fake_mkdir(path, mode=0o777, *, dir_fd=None):
        if _under(path, root_s):
            dir_hook(path)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    def fake_rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        if _under(dst, root_s) or _under(src, root_s):
            dir_hook(dst)
        return real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def fake_replace(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        if _under(dst, root_s) or _under(src, root_s):
            dir_hook(dst)
        return real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    builtins.open = io.open = fake_open
    os.open, os.mkdir, os.rename, os.replace = fake_os_open, fake_mkdir, fake_rename, fake_replace
    try:
        yield
    finally:
        builtins.open = io.open = real_open
        os.open, os.mkdir, os.rename, os.replace = real_os_open, real_mkdir, real_rename, real_replace


@contextmanager
def read_only(root: str | Path):
    """Everything under ``root`` behaves as on a read-only filesystem."""
    def refuse(path, *args, **kwargs):
        _fail(errno.EROFS, path)

    def refuse_open(real_open, file, mode, *args, **kwargs):
        _fail(errno.EROFS, file)

    with _patched(Path(root), refuse_open, refuse, refuse):
        yield


@contextmanager
def disk_full(root: str | Path, budget: int = 0):
    """Files written under ``root`` get ``budget`` bytes in all, then ENOSPC."""
    shared = _Budget(budget)

    def limited_open(real_open, file, mode, *args, **kwargs):
        return _FullFile(real_open(file, mode, *args, **kwargs), shared, file)

    def allow(path, *args, **kwargs):
        return None

    with _patched(Path(root), limited_open, allow, allow):
        yield shared

"""Writing files and directories so that a crash, a full disk or a read-only filesystem
never leaves half of one, and what quantroll creates has the permissions the user's
umask asks for.

- ``write_atomic``: a small file is written to a hidden temporary name beside it,
  flushed to disk, then renamed over the old one: a reader sees the old or the new
  content, never a mix, and a failure removes the temporary file.
- ``make_temp_dir``: ``tempfile.mkdtemp`` creates 0700 directories (it is meant for
  private scratch space); an output that is renamed into place must instead get what
  ``mkdir`` would give it (0755 under umask 022), so it is chmod-ed here. Its name
  carries the creator's pid, so that one left by a killed process can be told from
  one still being written (``stale_temp``).
- ``describe``: what an OSError from writing means to the user, and what to do.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quantroll.errors import QuantrollError

_ADVICE = {
    errno.ENOSPC: "no space left on the device; free some space or choose another location",
    errno.EDQUOT: "the disk quota is exhausted; free some space or choose another location",
    errno.EROFS: "the filesystem is read-only; choose a writable location",
    errno.EACCES: "permission denied; choose a location you can write",
    errno.EPERM: "operation not permitted; choose a location you can write",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
    errno.ENAMETOOLONG: "the file name is too long; choose a shorter path",
    errno.EIO: "an input/output error (a failing disk or network filesystem?); check the device",
}


def advice(err: OSError) -> str:
    """What an OSError means and what to do, without the file name."""
    return _ADVICE.get(err.errno) or str(err.strerror or err)


def describe(err: OSError) -> str:
    """One line for an OSError: the file it is about, what happened and what to do."""
    return f"{err.filename}: {advice(err)}" if err.filename else advice(err)


@contextmanager
def writing(what: str) -> Iterator[None]:
    """Turn an OSError raised inside the block into one QuantrollError about ``what``."""
    try:
        yield
    except OSError as err:
        raise QuantrollError(f"cannot write {what}: {advice(err)}") from None


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no way to read it without setting it: put it straight back
    os.umask(mask)
    return mask


def dir_mode() -> int:
    """What ``mkdir`` gives a new directory under the current umask (0755 under 022)."""
    return 0o777 & ~current_umask()


def file_mode() -> int:
    """What ``open(..., "w")`` gives a new file under the current umask (0644 under 022)."""
    return 0o666 & ~current_umask()


def follow_umask(root: Path) -> None:
    """Give every file and directory under ``root`` (and ``root``) the umask's permissions:
    what a library writes through a private temporary file (safetensors' ``save_file``
    makes 0600 files) or copies with its source's mode must read as if quantroll had
    created it with ``open``."""
    files, dirs = file_mode(), dir_mode()
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, dirs)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, files)


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new entry in ``path`` durable (ignored where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(path: Path, kind: str) -> Path:
    """A hidden name beside ``path`` that names its creator: ``.NAME.KIND-PID-RANDOM``."""
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def make_temp_dir(beside: Path, kind: str = "partial") -> Path:
    """An empty directory beside ``beside`` (same filesystem, so it can be renamed into
    place), with the permissions of a plain mkdir."""
    while True:
        candidate = temp_name(beside, kind)
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        os.chmod(candidate, dir_mode())
        return candidate


_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old|tmp)-(?P<pid>\d+)-[0-9a-f]{8}$")


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of the temporary names ``temp_name`` makes."""
    return _TEMP.match(name) is not None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here (one we may not signal counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


def stale_temps(directory: Path, name: str | None = None) -> list[Path]:
    """Temporary entries in ``directory`` (of ``name`` only, if given) whose creator is
    no longer running: what a killed writer left behind."""
    out = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return out
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m and (name is None or m["name"] == name) and not pid_alive(int(m["pid"])):
            out.append(entry)
    return sorted(out)


def remove(path: Path) -> None:
    """Delete a file or a directory tree; what cannot be deleted is left."""
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def write_atomic(path: str | Path, data: bytes | str, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new content.

    The file keeps the permissions of the one it replaces (a new one gets the umask's).
    On any failure (a full disk, Ctrl-C) the temporary file is removed and ``path`` is
    left as it was; the OSError propagates (callers name the file in their message).
    A kill -9 cannot clean up after itself, so the temporary files of ``path`` that a
    dead writer left are removed first."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    for stale in stale_temps(path.parent, path.name):  # what a writer of this file left when it was killed
        remove(stale)
    tmp = temp_name(path, "tmp")
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = None
    try:
        with open(tmp, "xb") as f:
            f.write(raw)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        fsync_dir(path.parent)


def make_dirs(path: Path) -> list[Path]:
    """``mkdir -p`` that returns the directories it created (outermost first), so that a
    failure later can remove exactly those."""
    created = []
    for p in reversed([path, *path.parents]):
        if not p.exists():
            try:
                p.mkdir()
            except FileExistsError:
                continue
            created.append(p)
    return created


def remove_empty_dirs(root: Path) -> None:
    """Remove the empty directories under ``root`` (not ``root``), deepest first."""
    for dirpath, _, _ in sorted(os.walk(root), key=lambda entry: -len(Path(entry[0]).parts)):
        if Path(dirpath) != Path(root):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass


def remove_empty(dirs: list[Path]) -> None:
    """Remove the directories ``make_dirs`` created, innermost first, while empty."""
    for d in reversed(dirs):
        try:
            d.rmdir()
        except OSError:
            break


__all__ = ["advice", "describe", "writing", "write_atomic", "make_temp_dir", "stale_temps", "is_temp_name",
           "file_mode", "follow_umask", "pid_alive", "dir_mode",
           "fsync_dir", "make_dirs", "remove_empty", "remove_empty_dirs", "remove", "temp_name"]

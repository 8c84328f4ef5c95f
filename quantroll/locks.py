"""One process at a time per output: a lock file that names its holder.

Two ``quantroll train`` processes saving into one directory used to both "succeed"
while their states replaced each other and their metrics lines interleaved; two
``compare`` passes over one output directory mixed their runs. So each of those
outputs has one lock, taken before any work and held to the end:

- the lock is ``flock`` on a small file (``DIR/.quantroll.lock``, or
  ``.NAME.quantroll.lock`` beside a file). The kernel drops it when its holder dies,
  however it dies, so a lock left by a killed process is taken over at once, never
  waited on; the file only tells the next process who holds it (pid, host, command);
- a second process is refused in one line naming that pid, before it writes anything;
- the holder removes the file when it is done (``kill -9`` leaves it; the next holder
  says it took it over).

Where a filesystem has no ``flock`` the pid in the file decides: a live pid holds it,
a dead one is stale and taken over.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from quantroll import durable
from quantroll.errors import QuantrollError

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None

LOCK_NAME = ".quantroll.lock"


def lock_path_for(target: Path, is_dir: bool) -> Path:
    """Where the lock of an output lives: inside a directory, beside a file."""
    return target / LOCK_NAME if is_dir else target.with_name(f".{target.name}.quantroll.lock")


def _holder_text(raw: bytes) -> dict:
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe_holder(holder: dict) -> str:
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return "another process (which has just started)"
    host = holder.get("host")
    where = f" on {host}" if host and host != socket.gethostname() else ""
    command = holder.get("command")
    return f"process {pid}{where}" + (f" ({command[:80]})" if isinstance(command, str) and command else "")


class OutputLock:
    """Exclusive use of ``target`` (a directory or a file) by this process.

    ``what`` names the output in messages (e.g. "--save runs/a"). A directory that does
    not exist is created for the lock, and removed again on release if it is still
    empty then (a run that failed before writing anything leaves nothing behind).
    """

    def __init__(self, target: str | Path, what: str, *, is_dir: bool = True, log=None):
        self.target = Path(target)
        self.what = what
        self.is_dir = is_dir
        self.path = lock_path_for(self.target, is_dir)
        self.log = log
        self._fd: int | None = None
        self._created: list[Path] = []

    def acquire(self) -> "OutputLock":
        if self.is_dir:
            with durable.writing(self.what):
                self._created = durable.make_dirs(self.target)
        try:
            self._acquire()
        except BaseException:
            durable.remove_empty(self._created)
            raise
        return self

    def _acquire(self) -> None:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as err:
                raise QuantrollError(f"{self.what}: cannot create the lock file {self.path} "
                                     f"({durable.advice(err)})") from None
            previous = _holder_text(os.pread(fd, 4096, 0))
            if not self._lock(fd, previous):
                continue  # the file was replaced under us: lock the new one
            break
        if previous.get("pid") not in (None, os.getpid()) and self.log is not None:
            self.log(f"{self.what}: took over the lock of {_describe_holder(previous)}, which is no longer running")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                  "command": " ".join(["quantroll", *sys.argv[1:]])}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd

    def _lock(self, fd: int, previous: dict) -> bool:
        """Take the kernel lock on ``fd`` (True), or find that the path now names another
        file (False); refuse if a live process holds it."""
        use_flock = fcntl is not None
        if use_flock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder_text(os.pread(fd, 4096, 0)) or previous  # it may have been written since
                os.close(fd)
                self._refuse(holder)
            except OSError:  # no flock on this filesystem: the pid in the file decides
                use_flock = False
        if not use_flock:
            pid = previous.get("pid")
            same_host = previous.get("host") in (None, socket.gethostname())
            if isinstance(pid, int) and pid != os.getpid() and (not same_host or durable.pid_alive(pid)):
                os.close(fd)
                self._refuse(previous)
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            now = None
        mine = os.fstat(fd)
        if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)
            return False
        return True

    def _refuse(self, holder: dict) -> None:
        pid = holder.get("pid")
        stop = f" (or stop it: kill {pid})" if isinstance(pid, int) else ""
        raise QuantrollError(f"{self.what} is in use by {_describe_holder(holder)}; wait for it to finish{stop}, "
                             "or choose another path")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: a process waiting on this file sees it replaced
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None
        durable.remove_empty(self._created)

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

"""Whether a run's ``run.json`` still tells the truth about it.

The runner writes ``"status": "running"`` when a run starts and its outcome when it
ends. A compare stopped by Ctrl-C or SIGTERM marks the run ``"interrupted"`` on its way
out (``terminate_as_interrupt`` turns SIGTERM into the same exception as Ctrl-C, so that
one path does it); one killed outright (``kill -9``, a lost machine) cannot, so the
record names its owner (pid and host of the compare) and a reader sees that an owner
that is no longer running on this host finished nothing: ``status`` reads it as
interrupted. A record on another host is taken at its word. A child stopped by SIGTERM or
SIGINT (a time limit's ``timeout`` and a terminal's Ctrl-C signal the whole process group,
so the child can end before its compare hears of it) was interrupted too, not failed.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from quantroll.durable import pid_alive

INTERRUPTED = "interrupted"


def mark_interrupted(record: dict, err: BaseException) -> dict:
    """The fields a run record gets when its compare is stopped while it runs."""
    why = "Ctrl-C or SIGTERM" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"
    return {"status": INTERRUPTED, "error": f"interrupted ({why}); rerun the compare to resume it from its last save"}


def stopped_by_signal(code: int) -> str | None:
    """The name of the signal that ended a child with exit ``code`` (subprocess's negative
    codes), or None where it exited by itself."""
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def interrupted_child(code: int) -> bool:
    """Whether a child that exited with ``code`` was stopped as a time limit or Ctrl-C stops
    it (SIGTERM, SIGINT): its run resumes from its last save rather than counting as failed."""
    return stopped_by_signal(code) in ("SIGTERM", "SIGINT")


def status(record: dict) -> str:
    """The record's status, with a "running" whose owner is gone read as interrupted."""
    value = record.get("status")
    if value != "running":
        return value
    pid, host = record.get("pid"), record.get("host")
    if isinstance(pid, int) and not isinstance(pid, bool) and host == socket.gethostname() and not pid_alive(pid):
        return INTERRUPTED
    return value


def settled(record: dict) -> dict:
    """``record`` with a dead owner's "running" replaced by "interrupted" (and why)."""
    if record.get("status") == "running" and status(record) == INTERRUPTED:
        return {**record, "status": INTERRUPTED,
                "error": f"its compare (process {record['pid']}) ended without finishing it; rerun the compare "
                         "to redo it"}
    return record


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so that
    the block's cleanup runs; the previous handler is put back after."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: signals are not ours to set
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

"""durable.write_atomic: what a killed writer of the same file left is cleaned up, and
nothing else is touched."""

import os
import subprocess
import sys

from quantroll import durable


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not durable.pid_alive(proc.pid)
    return proc.pid


def test_write_atomic_removes_what_a_killed_writer_of_the_file_left(tmp_path):
    target = tmp_path / "m.jsonl"
    target.write_text("old\n")
    dead = _dead_pid()
    killed = tmp_path / f".m.jsonl.tmp-{dead}-0123abcd"  # a kill -9 between write and rename
    killed.write_text("half")
    live = tmp_path / f".m.jsonl.tmp-{os.getpid()}-0123abcd"  # a writer still running: not ours to remove
    live.write_text("in progress")
    other = tmp_path / f".other.jsonl.tmp-{dead}-0123abcd"  # another file's: left for its own writer
    other.write_text("x")

    durable.write_atomic(target, "new\n")

    assert target.read_text() == "new\n"
    assert not killed.exists()
    assert live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name, other.name])

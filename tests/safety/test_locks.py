"""One process per output: a second `train` on one --save directory (or one metrics
file, or a second `compare` on one output directory) is refused naming the holder's
pid; a lock left by a killed process is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantroll.errors import QuantrollError
from quantroll.locks import LOCK_NAME, OutputLock
from tests.safety.helpers import assert_refused, run_cli, snapshot, train_args, write_model

REPO = Path(__file__).resolve().parents[2]


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with OutputLock(tmp_path / "d", "--save d"):
        holder = json.loads((tmp_path / "d" / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(QuantrollError, match=rf"^--save d is in use by process {os.getpid()} .*kill {os.getpid()}"):
            OutputLock(tmp_path / "d", "--save d").acquire()
    assert not (tmp_path / "d").exists()  # created for the lock, empty after: removed


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    notes = []
    with OutputLock(tmp_path / "d", "--save d", log=notes.append):
        assert json.loads((tmp_path / "d" / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(notes) == 1 and f"took over the lock of process {dead.pid}" in notes[0]
    assert sorted(os.listdir(tmp_path / "d")) == []  # the lock file is gone; the directory was not ours to remove


def test_a_file_lock_lives_beside_the_file(tmp_path):
    with OutputLock(tmp_path / "m.jsonl", "--metrics-file m.jsonl", is_dir=False):
        assert (tmp_path / ".m.jsonl.quantroll.lock").is_file()
        with pytest.raises(QuantrollError, match="in use by process"):
            OutputLock(tmp_path / "m.jsonl", "--metrics-file m.jsonl", is_dir=False).acquire()
    assert os.listdir(tmp_path) == []


def _wait_stopped(pid: int, seconds: float = 30.0) -> None:
    """Until the kernel reports ``pid`` stopped (state T in /proc/PID/stat), where /proc exists."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + seconds
    while stat.exists() and stat.read_text().rpartition(")")[2].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.01)


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_two_trainings_on_one_save_directory(tmp_path, capsys):
    """The first trains; the second, on the same --save (and metrics file), is refused in
    one line naming the first's pid and changes nothing; the first finishes untouched."""
    model = write_model(tmp_path / "model")
    save, metrics = tmp_path / "s", tmp_path / "m.jsonl"
    args = train_args(model, "--save", str(save), "--save-interval", "1", "--metrics-file", str(metrics))
    first = subprocess.Popen([sys.executable, "-m", "quantroll", *args, "--num-rollout", "12"], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(save / "LATEST", first)  # it holds the locks and has saved once
        os.kill(first.pid, signal.SIGSTOP)  # paused, so that the directory holds still while the others try
        _wait_stopped(first.pid)  # kill() returns before the stop: a write in flight could still land
        before = snapshot(tmp_path)
        for other in ([*args, "--num-rollout", "12"], [*args, "--load", str(save), "--num-rollout", "12"],
                      train_args(model, "--metrics-file", str(metrics), "--force")):
            rc, out, err = run_cli(capsys, other)
            line = assert_refused(rc, out, err, f"is in use by process {first.pid}", "train")
            assert line.split(": error: ")[1].startswith(("--save", "--metrics-file")), line
        assert snapshot(tmp_path) == before
    finally:
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(12))
    assert not (save / LOCK_NAME).exists() and not (tmp_path / ".m.jsonl.quantroll.lock").exists()

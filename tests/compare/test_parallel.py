"""compare --jobs (compare/parallel.py): where each run goes, the refusals before any run,
the pool's order, concurrency and interruption, and a whole compare of two runs at once on
the CPU that ends as the same compare one run at a time does."""

import json
import subprocess
import sys
import threading
import time

import pytest

from quantroll.cli import main
from quantroll.compare.parallel import Placement, placement_for, run_all, visible_gpus
from quantroll.compare.runner import _wait
from quantroll.errors import QuantrollError


def test_visible_gpus_are_the_parents_names():
    assert visible_gpus("cuda", 4, {}) == ("0", "1", "2", "3")
    assert visible_gpus("cuda", 2, {"CUDA_VISIBLE_DEVICES": "5, 7"}) == ("5", "7")  # a child sees "5", not "0"
    assert visible_gpus("cpu", 4, {}) == () and visible_gpus("cuda", 0, {}) == ()


def test_placement_spreads_runs_over_gpus_and_says_when_they_share_one():
    two = Placement(4, ("5", "7"))
    assert [two.env(k) for k in range(4)] == [{"CUDA_VISIBLE_DEVICES": g} for g in ("5", "7", "5", "7")]
    assert two.shares_device and two.record(1) == {"jobs": 4, "gpu": "7", "shared_device": True}
    own = Placement(2, ("0", "1"))
    assert not own.shares_device and own.record(0)["gpu"] == "0"
    assert Placement(1, ("0", "1")).env(0) == {}  # one run at a time keeps the parent's devices
    assert Placement(1, ("0", "1")).record(0)["gpu"] is None
    assert Placement(1, ("1",), pinned=True).env(0) == {"CUDA_VISIBLE_DEVICES": "1"}  # unless --gpus names them
    assert Placement(2, ()).env(1) == {} and Placement(2, ()).shares_device  # a CPU: the runs share its cores


def test_refusals_name_the_flag_before_any_run():
    with pytest.raises(QuantrollError, match="--jobs must be >= 1"):
        placement_for("cpu", 0, None, (), 0)
    with pytest.raises(QuantrollError, match="--gpus places runs on GPUs; --device is cpu"):
        placement_for("cpu", 2, "0", (), 0)
    with pytest.raises(QuantrollError, match=r"--gpus 0,3: 3 not among the visible GPUs \(0, 1\)"):
        placement_for("cuda", 2, "0,3", ("--kv-cache-memory-gb", "4"), 2, {})
    with pytest.raises(QuantrollError, match=r"--jobs 3 on 2 GPU.*\"--kv-cache-memory-gb 8\""):
        placement_for("cuda", 3, None, (), 2, {})
    shared = placement_for("cuda", 3, None, ("--kv-cache-memory-gb=4",), 2, {})
    assert shared.gpus == ("0", "1") and shared.shares_device
    assert placement_for("cuda", 2, "1", ("--kv-cache-memory-gb", "4"), 2, {}).gpus == ("1",)
    assert placement_for("cuda", 1, "1", (), 2, {}).env(0) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert placement_for("cuda", 1, None, (), 2, {}).env(0) == {}
    assert placement_for("cuda", 2, None, (), 2, {}).gpus == ("0", "1")  # one GPU each: the default pool is fine


def test_the_pool_runs_jobs_at_once_on_distinct_slots_and_keeps_the_order():
    both = threading.Barrier(2, timeout=10)  # only passes when two runs are in flight together
    busy, seen = set(), []
    lock = threading.Lock()

    def run(item, slot, stop):
        with lock:
            assert slot not in busy
            busy.add(slot)
            seen.append(slot)
        if item < 2:
            both.wait()
        time.sleep(0.01)
        with lock:
            busy.discard(slot)
        return item * 10

    assert run_all(list(range(5)), run, Placement(2)) == [0, 10, 20, 30, 40]
    assert set(seen) == {0, 1}
    assert run_all([1, 2], lambda item, slot, stop: (slot, stop), Placement(1)) == [(0, None), (0, None)]


def test_an_interrupted_run_stops_the_others():
    started = threading.Event()
    stopped = []

    def run(item, slot, stop):
        if item == 0:
            started.wait(10)
            raise KeyboardInterrupt  # as Ctrl-C in the run that noticed it
        started.set()
        while not stop.is_set():
            time.sleep(0.01)
        stopped.append(item)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_all([0, 1, 2], run, Placement(2))
    # item 1 was running and stopped; item 2 either never started or (if it took item 0's slot
    # before the stop) stopped the same way: none ran to its end
    assert 1 in stopped and set(stopped) <= {1, 2}


def test_wait_stops_a_child_when_asked():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            _wait(proc, stop)
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
        proc.wait()
    assert _wait(subprocess.Popen([sys.executable, "-c", "pass"]), None) == 0


@pytest.mark.slow
def test_two_runs_at_once_end_as_one_at_a_time(tmp_path, capsys):
    """The built-in model on the CPU, bf16 and fp8 mode 1, one step: --jobs 2 writes the same
    metrics (times aside) as --jobs 1, each record keeps its placement, and the report warns
    that the times are not speed figures."""
    args = ["--precisions", "bf16,fp8", "--modes", "1", "--corrections", "none", "--seeds", "1", "--num-rollout", "1",
            "--eval-interval", "0", "--save-interval", "0",
            "--train-args", "--rollout-batch-size 4 --n-samples-per-prompt 2"]
    assert main(["compare", "--output-dir", str(tmp_path / "one"), *args]) == 0
    assert main(["compare", "--output-dir", str(tmp_path / "two"), "--jobs", "2", *args]) == 0
    varying = ("time", "per_s", "memory", "_gib", "preemptions")
    for run in ("bf16-baseline-none-seed1", "fp8-rollout-none-seed1"):
        a, b = ([{k: v for k, v in json.loads(x).items() if not any(p in k for p in varying)}
                 for x in (tmp_path / d / "runs" / run / "metrics.jsonl").read_text().splitlines()] for d in ("one", "two"))
        assert a == b and len(a) == 1, run
        record = json.loads((tmp_path / "two" / "runs" / run / "run.json").read_text())
        assert record["status"] == "done" and record["placement"] == {"jobs": 2, "gpu": None, "shared_device": True}
        assert json.loads((tmp_path / "one" / "runs" / run / "run.json").read_text())["placement"]["jobs"] == 1
    assert "shared their device with other runs (compare --jobs 2)" in (tmp_path / "two" / "report.md").read_text()
    assert "shared their device" not in (tmp_path / "one" / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("to_group", [False, True], ids=["to-compare", "to-process-group"])
def test_sigterm_stops_every_running_run_and_marks_it_interrupted(tmp_path, to_group):
    """A time limit's SIGTERM to a compare running two runs at once: both children stop, both
    records say interrupted (to resume from their saves), and compare exits non-zero. Sent
    to the process group (as ``timeout`` and a terminal's Ctrl-C send it) it reaches the
    children too, which may end before their compare hears of it: still interrupted, not
    failed."""
    import os
    import signal
    from pathlib import Path

    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "quantroll", "compare", "--output-dir", str(out), "--jobs", "2",
                             "--precisions", "bf16,fp8", "--modes", "1", "--corrections", "none", "--seeds", "1",
                             "--num-rollout", "50", "--eval-interval", "0", "--save-interval", "1",
                             "--train-args", "--rollout-batch-size 4 --n-samples-per-prompt 2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=to_group)
    runs = [out / "runs" / r for r in ("bf16-baseline-none-seed1", "fp8-rollout-none-seed1")]

    def status(run):
        try:
            return json.loads((run / "run.json").read_text()).get("status")
        except (OSError, ValueError):
            return None

    deadline = time.monotonic() + 300
    try:
        while not all(status(r) == "running" and (r / "metrics.jsonl").is_file() for r in runs):
            assert proc.poll() is None and time.monotonic() < deadline, "both runs never ran together"
            time.sleep(0.05)
        if to_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        proc.kill()
        proc.wait()
    assert [status(r) for r in runs] == ["interrupted", "interrupted"]
    for r in runs:  # the children are gone: their logs stop growing
        size = (r / "train.log").stat().st_size
        time.sleep(1.0)
        assert (r / "train.log").stat().st_size == size


def test_a_child_ended_by_a_signal_is_named_and_sigterm_reads_as_interrupted(tmp_path):
    import signal

    from quantroll.compare.runner import _error_line
    from quantroll.compare.runstatus import interrupted_child, stopped_by_signal

    assert stopped_by_signal(0) is None and stopped_by_signal(3) is None
    assert stopped_by_signal(-signal.SIGTERM) == "SIGTERM" and stopped_by_signal(-signal.SIGKILL) == "SIGKILL"
    assert interrupted_child(-signal.SIGTERM) and interrupted_child(-signal.SIGINT)
    assert not interrupted_child(-signal.SIGKILL) and not interrupted_child(1) and not interrupted_child(0)
    log = tmp_path / "train.log"
    assert _error_line(log, -signal.SIGKILL).startswith("killed by SIGKILL before writing anything")
    assert _error_line(log, 3) == "exited with code 3 and no output"
    log.write_text("step 0\nRuntimeError: CUDA out of memory\nexiting\n")
    assert _error_line(log, 1) == "RuntimeError: CUDA out of memory"

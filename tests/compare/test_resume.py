"""`quantroll compare` killed mid-run (SIGKILL to the whole process group, compare and its
train child) and run again resumes the run from its last saved step and ends with the
same metrics lines as a run never interrupted (CPU, the built-in model, 3 steps); run
again with a larger --num-rollout, a finished run continues from its last save and
matches a run of that length from the start."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantroll.cli import main
from quantroll.commands.compare import SavedStates
from quantroll.compare.runner import STATE_DIR

RUN = "bf16-baseline-none-seed1"
BASE = ["--precisions", "bf16", "--seeds", "1", "--save-interval", "1", "--eval-interval", "2",
        "--train-args", "--rollout-batch-size 4 --n-samples-per-prompt 2 --eval-size 8"]
ARGS = BASE + ["--num-rollout", "3"]
# measured, not modelled: wall-clock times, throughput and memory differ between any two runs;
# weight_version counts the weight updates of the process (a resumed one counts from its load)
VARYING = ("time", "per_s", "memory", "_gib", "preemptions", "weight_version")


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _deterministic(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(part in k for part in VARYING)}


def _kill_after_first_save(out: Path) -> None:
    """Start compare in its own process group and SIGKILL the group once the run has saved step 0."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "quantroll", "compare", "--output-dir", str(out), *ARGS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    run_dir = out / "runs" / RUN
    deadline = time.monotonic() + 600
    try:
        while SavedStates.saved_step(run_dir / STATE_DIR) is None:
            assert proc.poll() is None, "compare ended before its first save"
            assert time.monotonic() < deadline, "no save within 10 minutes"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_save_and_matches_an_uninterrupted_one(tmp_path, capsys):
    straight = tmp_path / "straight"
    assert main(["compare", "--output-dir", str(straight), *ARGS]) == 0
    killed = tmp_path / "killed"
    _kill_after_first_save(tmp_path / "before-the-move")
    (tmp_path / "before-the-move").rename(killed)  # moved while interrupted: its runs are still the same runs
    run_dir = killed / "runs" / RUN
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    step = SavedStates.saved_step(run_dir / STATE_DIR)
    assert step is not None and step + 1 < 3, "the kill came after the run finished: nothing left to resume"
    capsys.readouterr()
    assert main(["compare", "--output-dir", str(killed), *ARGS]) == 0
    assert f"{RUN}: resuming after its saved step {step} of 3" in capsys.readouterr().out
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "done" and record["resumed_after_steps"] == [step]
    a, b = _lines(straight / "runs" / RUN / "metrics.jsonl"), _lines(run_dir / "metrics.jsonl")
    assert [r["step"] for r in b] == [0, 1, 2]
    # bit-exact: the save holds the weights, FP32 masters, AdamW moments and both RNG states
    assert [_deterministic(r) for r in b] == [_deterministic(r) for r in a]
    assert "eval_trainer_by_len" in b[2] and "reward_by_len" in b[2]
    # a third pass keeps the finished run as it is
    before = (run_dir / "metrics.jsonl").read_bytes()
    assert main(["compare", "--output-dir", str(killed), *ARGS]) == 0
    assert f"{RUN}: done earlier, kept" in capsys.readouterr().out
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    assert (run_dir / STATE_DIR / "LATEST").is_file()
    # more steps asked: the finished run continues from its last save (eval at steps 0, 2 and the new last, 3)
    longer = tmp_path / "longer"
    assert main(["compare", "--output-dir", str(longer), *BASE, "--num-rollout", "4"]) == 0
    capsys.readouterr()
    assert main(["compare", "--output-dir", str(killed), *BASE, "--num-rollout", "4"]) == 0
    assert f"{RUN}: extending after its saved step 2 of 4" in capsys.readouterr().out
    c, d = _lines(longer / "runs" / RUN / "metrics.jsonl"), _lines(run_dir / "metrics.jsonl")
    assert [r["step"] for r in d] == [0, 1, 2, 3] and [_deterministic(r) for r in d] == [_deterministic(r) for r in c]
    assert json.loads((run_dir / "run.json").read_text())["resumed_after_steps"] == [step, 2]


def test_a_run_is_the_same_up_to_its_number_of_steps_and_wherever_its_directory_is(tmp_path):
    from quantroll.compare.runner import OUTPUT_DIR, _same_command, portable

    old, new = tmp_path / "a", tmp_path / "b" / "moved"
    cmd = ["quantroll", "train", "--num-rollout", "3", "--seed", "1", "--metrics-file", f"{old}/runs/r/metrics.jsonl"]
    previous = {"command": cmd, "output_dir": str(old)}
    here = ["quantroll", "train", "--num-rollout", "3", "--seed", "1", "--metrics-file", f"{new}/runs/r/metrics.jsonl"]
    assert portable(here, new)[-1] == f"{OUTPUT_DIR}/runs/r/metrics.jsonl"
    assert _same_command(previous, here, new)
    longer = [("30" if x == "3" else x) for x in here]
    assert _same_command(previous, longer, new, masked=True) and not _same_command(previous, longer, new)
    assert not _same_command(previous, [("3" if x == "1" else x) for x in here], new, masked=True)
    assert not _same_command(previous, here, tmp_path / "c")  # the file sits in another directory than the output's
    assert not _same_command(None, here, new)
    # run.json written before the output directory was recorded: read as written where it is now
    assert _same_command({"command": cmd}, cmd, old) and not _same_command({"command": cmd}, here, new)
    assert portable([str(tmp_path / "ab")], tmp_path / "a") == [str(tmp_path / "ab")]  # a prefix, not a directory


def test_save_interval_reaches_the_runs_and_is_owned_by_compare(tmp_path):
    from quantroll.commands.compare import _train_args
    from quantroll.compare.matrix import RunSpec
    from quantroll.compare.runner import CompareSetup, command_for
    from quantroll.errors import QuantrollError

    setup = CompareSetup(tmp_path, tmp_path / "src", "m", False, "cpu", 3, 1, (), (), {}, save_interval=2)
    cmd = command_for(setup, RunSpec("bf16", False, "none", 1, 8), {"bf16": tmp_path / "src"}, tmp_path / "r")
    assert cmd[cmd.index("--save") + 1] == str(tmp_path / "r" / STATE_DIR)
    assert cmd[cmd.index("--save-interval") + 1] == "2"
    off = CompareSetup(tmp_path, tmp_path / "src", "m", False, "cpu", 3, 1, (), (), {})
    assert "--save" not in command_for(off, RunSpec("bf16", False, "none", 1, 8), {"bf16": tmp_path}, tmp_path)
    for flag in ("--save-interval 3", "--save x", "--load x", "--force"):
        with pytest.raises(QuantrollError, match="compare sets them per run"):
            _train_args(flag)


def test_ctrl_c_while_the_report_is_written_says_how_to_continue(tmp_path, capsys, monkeypatch):
    """Ctrl-C after the last run, while the report is written, is compare's own line (the
    runs are kept, rerun to continue), as during a run; it was the bare 'interrupted'. The
    rerun writes the report from the kept runs."""
    import quantroll.compare.report as report

    write_report = report.write_report

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "c"
    argv = ["compare", "--output-dir", str(out), *BASE, "--num-rollout", "1"]
    monkeypatch.setattr(report, "write_report", interrupt)
    assert main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"quantroll compare: interrupted: finished runs are kept in {out}; run the same command again to " \
                  "continue"
    monkeypatch.setattr(report, "write_report", write_report)
    assert main(argv) == 0
    assert (out / "report.md").is_file() and "done earlier, kept" in capsys.readouterr().out

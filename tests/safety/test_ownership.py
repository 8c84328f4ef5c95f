"""What quantroll may replace, and what it says about runs it could not finish (issue 41):
the one rule of quantroll/outputs.py stated once in every writing command's --help, the
current directory never replaced, an owned --save directory's marker, a compare run's
run.json marked interrupted (Ctrl-C, SIGTERM) or read as interrupted when its owner is
dead, and the memory estimate that refuses sizes that cannot fit."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantroll.cli import build_parser, main
from quantroll.compare import runner
from quantroll.compare.matrix import build_matrix
from quantroll.compare.rundata import load_runs
from quantroll.compare.runstatus import status, terminate_as_interrupt
from quantroll.errors import QuantrollError
from quantroll.outputs import FORCE_HELP, check_replace, foreign_files, read_marker, record_owned, write_marker
from quantroll.rl.config import TrainConfig
from quantroll.rl.memory import GIB, check_fits, estimate_gib
from tests.safety.helpers import assert_refused, run_cli, write_model


def _help(command: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return " ".join(sub.choices[command].format_help().split())


@pytest.mark.parametrize("command", ["train", "sft", "convert", "attribute"])
def test_every_writing_command_states_the_one_rule_once(command):
    assert _help(command).count(" ".join(FORCE_HELP.split())) == 1


def test_compare_states_what_its_output_directory_may_hold():
    assert "It must be new, empty or one compare wrote (listed in its .quantroll)" in _help("compare")


@pytest.mark.parametrize("target", [".", ".."])
def test_sft_never_replaces_the_current_directory(tmp_path, monkeypatch, capsys, target):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    rc, out, err = run_cli(capsys, ["sft", "--save", target, "--force", "--steps", "1"])
    assert_refused(rc, out, err, "is the current directory (or holds it), which quantroll never replaces", "sft")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"] and not any(here.iterdir())


def test_an_owned_directory_lists_nested_files_and_whole_directories(tmp_path):
    d = tmp_path / "d"
    (d / "runs" / "a").mkdir(parents=True)
    (d / "runs" / "a" / "m.jsonl").write_text("x")
    (d / "report.md").write_text("x")
    assert foreign_files(d) == ["report.md", "runs/a/m.jsonl"]  # no marker: nothing is quantroll's
    record_owned(d, files=("report.md",), dirs=("runs",))
    assert foreign_files(d) == []
    (d / "runs" / "a" / "mine.txt").write_text("x")  # under a directory quantroll owns: its to replace
    (d / "notes").mkdir()
    (d / "notes" / "n.txt").write_text("x")
    assert foreign_files(d) == ["notes/n.txt"]
    (d / ".quantroll").write_text('{"format": "something else", "files": ["notes/n.txt"]}')
    assert read_marker(d) == (frozenset(), frozenset())  # a marker quantroll did not write names nothing


def test_an_empty_directory_or_one_with_only_the_marker_may_be_used_without_force(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    check_replace("--x d", d, force=False)
    write_marker(d, [])
    check_replace("--x d", d, force=False)
    (d / "f").write_text("x")
    write_marker(d)
    with pytest.raises(QuantrollError, match="pass --force"):
        check_replace("--x d", d, force=False)
    check_replace("--x d", d, force=True)


# -- run.json of a compare run ------------------------------------------------------------------
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_running_record_whose_owner_is_dead_reads_as_interrupted(tmp_path):
    alive = {"status": "running", "pid": os.getpid(), "host": socket.gethostname()}
    assert status(alive) == "running"
    assert status({**alive, "pid": _dead_pid()}) == "interrupted"
    assert status({**alive, "pid": _dead_pid(), "host": "another-host"}) == "running"  # taken at its word
    assert status({"status": "running"}) == "running"  # an older record names no owner
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({**alive, "pid": _dead_pid(), "run_id": "r1"}))
    [loaded] = load_runs(tmp_path)
    assert loaded.spec["status"] == "interrupted" and "ended without finishing it" in loaded.spec["error"]


def test_sigterm_inside_the_block_is_an_interrupt_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with terminate_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the handler raises at once; without it the test would wait 30 s, then fail
    assert signal.getsignal(signal.SIGTERM) == before


class _Config:
    def to_json(self) -> str:
        return "{}\n"


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_compare_stopped_while_a_run_runs_marks_it_interrupted(tmp_path, monkeypatch, how):
    killed = []

    class Child:  # the train process: SIGTERM or Ctrl-C reaches the compare while it waits
        def __init__(self, *args, **kwargs):
            pass

        def wait(self):
            if killed:
                return -9
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)  # interrupted by the handler's KeyboardInterrupt
                raise AssertionError("SIGTERM did not interrupt the wait")
            raise KeyboardInterrupt

        def kill(self):
            killed.append(True)

    monkeypatch.setattr(runner.subprocess, "Popen", Child)
    [spec] = build_matrix("bf16", "none", "1", "1", 8, moe=False)
    setup = runner.CompareSetup(tmp_path, tmp_path / "src", "m", False, "cpu", 1, 1, (), (), {})
    with pytest.raises(KeyboardInterrupt):
        runner.run_one(setup, spec, {"bf16": tmp_path / "src"}, lambda argv: _Config(), log=lambda *_: None)
    record = json.loads((tmp_path / "runs" / spec.run_id / "run.json").read_text())
    assert killed and record["status"] == "interrupted" and "rerun the compare" in record["error"]
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()


# -- sizes that cannot fit ------------------------------------------------------------------------
def test_the_memory_estimate_counts_each_part_as_documented():
    cfg = TrainConfig.of(rollout_batch_size=10, n_samples_per_prompt=4, rollout_max_response_len=99,
                         micro_batch_size=8, train_problems=100, eval_size=50, device="cpu")
    est = estimate_gib(cfg, params=1000, vocab_size=500)
    assert est["weights"] * GIB == pytest.approx(1000 * 20)
    assert est["kv_pool"] == 1.0  # the CPU default pool
    assert est["logits"] * GIB == pytest.approx(8 * 100 * 500 * 4)  # one micro-batch of 8, 100 tokens each
    assert est["rollout"] * GIB == pytest.approx(40 * (200 + 100 * 16) + 150 * 200)
    halves = estimate_gib(cfg, params=1000, vocab_size=500, shards=2)
    assert halves["weights"] * GIB == pytest.approx(1000 * (2 + 18 / 2)) and halves["logits"] == est["logits"] / 2


def test_a_run_that_cannot_fit_is_refused_with_the_estimate_and_one_that_fits_is_not(tmp_path):
    model = write_model(tmp_path / "m")
    small = TrainConfig.of(hf_checkpoint=str(model), device="cpu")
    est = check_fits(small, model, host_gib=64.0)
    need = sum(est.values())
    check_fits(small, model, host_gib=need * 1.01)
    with pytest.raises(QuantrollError, match=rf"needs at least {need:.3g} GiB .* available memory holds"):
        check_fits(small, model, host_gib=need * 0.99)
    gpu = TrainConfig.of(hf_checkpoint=str(model), device="cuda", rollout_batch_size=10**6)
    with pytest.raises(QuantrollError, match="but the GPU holds 1 GiB"):
        check_fits(gpu, model, host_gib=1e6, device_gib=1.0)


def test_train_refuses_a_huge_batch_before_writing_anything(tmp_path, capsys):
    model = write_model(tmp_path / "m")
    metrics = tmp_path / "m.jsonl"
    rc = main(["train", "--hf-checkpoint", str(model), "--device", "cpu", "--rollout-batch-size", str(10**9),
               "--metrics-file", str(metrics)])
    assert rc == 2 and "this run needs at least" in capsys.readouterr().err
    assert not metrics.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_the_shipped_models_are_listed_as_quantroll_s():
    from quantroll.builtin import builtin_checkpoint

    for kind in ("dense", "moe"):
        assert foreign_files(builtin_checkpoint(kind)) == [], kind  # `quantroll sft --force` may regenerate them

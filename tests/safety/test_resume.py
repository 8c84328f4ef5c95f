"""Resume and restart without loss or mix-up: a damaged last metrics line (a crash
mid-write) is dropped with a note and the run continues; --force starts over and says
so; leftovers of killed saves (of this format and the old one) are removed at the next
start; a full disk during a save keeps the previous state whole and resumable."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from quantroll.cli import main
from quantroll.outputs import read_marker
from quantroll.rl import savedir
from tests.safety import faults
from tests.safety.helpers import assert_refused, run_cli, train_args, write_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("m") / "model")


def _steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def _run(model, tmp_path, *extra):
    return train_args(model, "--save", str(tmp_path / "s"), "--save-interval", "1",
                      "--metrics-file", str(tmp_path / "m.jsonl"), *extra)


@pytest.mark.parametrize("tail", [b'{"step": 2, "reward_m', b'{"step": 2, "x": "\xe2\x82', b"\xff\xfe\x00garbage"])
def test_a_damaged_last_metrics_line_is_dropped_with_a_note(model, tmp_path, capsys, tail):
    assert main(_run(model, tmp_path)) == 0
    metrics = tmp_path / "m.jsonl"
    metrics.write_bytes(metrics.read_bytes() + tail)  # a crash in the middle of step 2's line
    rc, out, err = run_cli(capsys, _run(model, tmp_path, "--load", str(tmp_path / "s"), "--num-rollout", "4"))
    assert rc == 0, err
    assert "dropped its damaged last line 3" in out
    assert _steps(metrics) == [0, 1, 2, 3]


def test_lines_after_the_save_are_dropped_on_resume(model, tmp_path, capsys):
    assert main(_run(model, tmp_path)) == 0
    metrics = tmp_path / "m.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines + [json.dumps({**json.loads(lines[-1]), "step": 2, "stray": True})]) + "\n")
    assert main(_run(model, tmp_path, "--load", str(tmp_path / "s"), "--num-rollout", "3")) == 0
    assert _steps(metrics) == [0, 1, 2] and "stray" not in metrics.read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the atomic rewrite's temp file


def test_force_starts_over_and_says_so(model, tmp_path, capsys):
    assert main(_run(model, tmp_path, "--num-rollout", "3")) == 0
    rc, out, err = run_cli(capsys, _run(model, tmp_path, "--force", "--num-rollout", "2"))
    assert rc == 0, err
    assert "--force: deleted the run saved in --save" in out and "--force: overwriting --metrics-file" in out
    assert _steps(tmp_path / "m.jsonl") == [0, 1] and savedir.latest(tmp_path / "s").step == 1


def test_leftovers_of_killed_saves_are_removed_at_the_next_start(model, tmp_path, capsys):
    assert main(_run(model, tmp_path)) == 0
    save = tmp_path / "s"
    current = savedir.latest(save).path
    shutil.copytree(current, save / f".partial-{2**22 + 7}-0123abcd")  # a save killed while writing
    shutil.copytree(current, save / "step-00000000-89abcdef")  # killed after the pointer, before the deletion
    (save / ".LATEST.tmp-99999999-0123abcd").write_text("{")  # killed while replacing the pointer
    for old in (".s.partial-a1b2c3d4", ".s.old-x_y9z8w7"):  # the whole-directory saves of older quantroll
        (tmp_path / old).mkdir()
        (tmp_path / old / "trainer_state.pt").write_bytes(b"x" * 1000)
    rc, out, err = run_cli(capsys, _run(model, tmp_path, "--load", str(save), "--num-rollout", "3"))
    assert rc == 0, err
    assert "removed 5 leftover(s) of an interrupted save" in out
    assert sorted(p.name for p in save.iterdir()) == [".quantroll", "LATEST", savedir.latest(save).path.name]
    assert read_marker(save) == ({"LATEST"}, {savedir.latest(save).path.name})  # what the directory holds, no more
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_full_disk_during_a_save_keeps_the_previous_state(model, tmp_path, capsys):
    assert main(_run(model, tmp_path, "--num-rollout", "1")) == 0
    save = tmp_path / "s"
    one_state = sum(p.stat().st_size for p in savedir.latest(save).path.iterdir())
    budget = int(one_state * 1.5)  # the metrics lines and one more state fit; the second state does not
    with faults.disk_full(tmp_path, budget):
        rc, out, err = run_cli(capsys, _run(model, tmp_path, "--load", str(save), "--num-rollout", "5"))
    assert_refused(rc, out, err, f"cannot write --save {save}: no space left on the device", "train")
    saved = savedir.latest(save)
    assert saved.step == 1  # step 1's state was written; step 2's failed and left nothing
    assert sorted(p.name for p in save.iterdir()) == [".quantroll", "LATEST", saved.path.name]
    assert main(_run(model, tmp_path, "--load", str(save), "--num-rollout", "4")) == 0  # resumes after step 1
    assert _steps(tmp_path / "m.jsonl") == [0, 1, 2, 3]


def test_a_seed_of_any_64_bit_size_trains(model, tmp_path):
    """Seeds past 4295 used to overflow the engine's 32-bit sampling seed at step 0."""
    for seed in (5000, 2**64 - 1):
        assert main(train_args(model, "--seed", str(seed), "--num-rollout", "1")) == 0


def test_directories_follow_the_umask(model, tmp_path, capsys):
    """0755 under umask 022 for every directory quantroll creates (mkdtemp alone gives 0700)."""
    from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint

    old = os.umask(0o022)
    try:
        assert main(_run(model, tmp_path, "--save-hf", str(tmp_path / "hf"), "--rollout-precision", "fp8",
                         "--convert-dir", str(tmp_path / "conv"))) == 0
        convert_checkpoint(model, tmp_path / "fp8", ConvertConfig(format="fp8", progress=False))
        made = [tmp_path / "s", savedir.latest(tmp_path / "s").path, tmp_path / "hf", tmp_path / "conv",
                tmp_path / "fp8"]
        for d in made:
            assert oct(d.stat().st_mode & 0o777) == "0o755", d
        for f in (tmp_path / "m.jsonl", savedir.latest(tmp_path / "s").path / "state.json",
                  tmp_path / "s" / "LATEST", tmp_path / "fp8" / "config.json"):
            assert oct(f.stat().st_mode & 0o777) == "0o644", f
        os.umask(0o077)
        convert_checkpoint(model, tmp_path / "private", ConvertConfig(format="fp8", progress=False))
        assert oct((tmp_path / "private").stat().st_mode & 0o777) == "0o700"
    finally:
        os.umask(old)


def test_a_resume_with_other_settings_says_which(model, tmp_path, capsys):
    """--load with a changed setting (here --lr) goes on, as Miles does, but says what changed
    against the saved run's settings; the same settings say nothing (outputs and --num-rollout
    are not settings of the run's numbers)."""
    save = tmp_path / "s"
    base = train_args(model, "--save", str(save), "--save-interval", "1")
    assert main(base) == 0
    capsys.readouterr()
    assert main(base + ["--num-rollout", "3", "--load", str(save), "--lr", "1e-3"]) == 0
    out = capsys.readouterr().out
    assert f"--load {save}: resumed with settings other than the saved run's: optimizer.lr 0.0002 -> 0.001" in out
    assert main(base + ["--num-rollout", "4", "--load", str(save), "--lr", "1e-3", "--metrics-file",
                        str(tmp_path / "m.jsonl")]) == 0
    assert "resumed with settings other" not in capsys.readouterr().out


def test_a_resume_without_save_says_that_nothing_more_is_saved(model, tmp_path, capsys):
    """--load alone continues the run but keeps none of its new steps: said at the start, with
    the flag that would keep them; with --save the notice is absent."""
    save = tmp_path / "s"
    base = train_args(model, "--save", str(save), "--save-interval", "1")
    assert main(base) == 0
    capsys.readouterr()
    before = sorted(p.name for p in save.iterdir())
    assert main(train_args(model, "--load", str(save), "--num-rollout", "3")) == 0
    out = capsys.readouterr().out
    assert f"--load {save} without --save: the steps from here on are not saved (add --save {save}" in out
    assert sorted(p.name for p in save.iterdir()) == before
    assert main(base + ["--num-rollout", "3", "--load", str(save)]) == 0
    assert "without --save" not in capsys.readouterr().out

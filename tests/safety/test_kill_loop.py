"""Killed at random moments (``kill -9``, 20 times and more), a training resumed with
``--load`` every time loads its last complete save and continues: in the end the
metrics file holds every step exactly once, in order, and the save directory holds one
complete state and nothing else.

The kills land anywhere: during start-up, a rollout, the metrics write, the state save
(its tensor file, its record, the pointer's replacement, the old version's deletion),
the cleanup of a previous kill's leftovers, the resume's rewrite of the metrics file.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from quantroll.locks import LOCK_NAME
from quantroll.outputs import read_marker
from quantroll.rl import savedir
from tests.safety.child import forkserver
from tests.safety.helpers import train_args, write_model

KILLS = 30


def _context():
    return forkserver()


def _start(ctx, argv: list[str], log: Path):
    from tests.safety.child import run

    proc = ctx.Process(target=run, args=(argv, str(log)))
    proc.start()
    return proc


def _first_save(ctx, argv, log: Path, save: Path) -> float:
    """Run until the first state is saved, kill it there; the seconds that took."""
    start = time.monotonic()
    proc = _start(ctx, argv, log)
    while not (save / savedir.POINTER).exists():
        assert proc.exitcode is None, log.read_text()[-3000:]
        assert time.monotonic() - start < 600, "no save within 10 minutes"
        time.sleep(0.01)
    seconds = time.monotonic() - start
    proc.kill()
    proc.join()
    return seconds


@pytest.mark.slow
def test_kill_during_training_and_saves_then_resume(tmp_path):
    model = write_model(tmp_path / "model")
    save, metrics = tmp_path / "s", tmp_path / "m.jsonl"
    base = train_args(model, "--save", str(save), "--save-interval", "1", "--metrics-file", str(metrics),
                      "--num-rollout", "100000")
    ctx = _context()
    warm = _start(ctx, ["--version"], tmp_path / "warm.log")  # the forkserver imports torch once, here
    warm.join()
    # kills land uniformly over start-up and the first steps, scaled to this machine's speed
    window = 2.5 * _first_save(ctx, base + ["--force"], tmp_path / "attempt0.log", save)
    rng = random.Random(24)
    kills, resumes, attempt = 1, 0, 0
    while kills < KILLS:
        attempt += 1
        assert attempt < 4 * KILLS, "runs keep failing instead of being killed"
        resume = savedir.holds_run(save)
        resumes += resume
        argv = base + (["--load", str(save)] if resume else ["--force"])
        log = tmp_path / f"attempt{attempt}.log"
        proc = _start(ctx, argv, log)
        proc.join(rng.uniform(0.0, window))
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            kills += 1
        assert proc.exitcode == -9, log.read_text()[-3000:]  # killed, never failed on what a kill left
    # what the kills left must load: the last run resumes and finishes three more steps
    saved = savedir.latest(save)
    assert saved is not None and resumes == attempt, (saved, resumes, attempt)
    final = saved.step + 4
    log = tmp_path / "final.log"
    proc = _start(ctx, base[:-1] + [str(final), "--load", str(save)], log)
    proc.join(600)
    assert proc.exitcode == 0, log.read_text()[-3000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(final)), "a metrics line was lost or repeated"
    assert savedir.latest(save).step == final - 1
    left = sorted(p.name for p in save.iterdir())
    assert left == [".quantroll", "LATEST", savedir.latest(save).path.name], left  # no partial, old version, lock
    assert read_marker(save) == ({"LATEST"}, {savedir.latest(save).path.name})  # the marker names what is there
    assert LOCK_NAME not in left
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary files

"""Claim a training run's outputs before its work: one process per output, and no run
lost or mixed with another.

Under the locks (quantroll/locks.py) of ``--metrics-file``, ``--save`` and ``--load``:
the leftovers of a killed save are removed; a fresh run refuses a ``--save`` directory
or a metrics file that holds a run unless ``--force`` (which says so, and deletes that
run only when the new one is about to write its first step); a resume refuses a save
that has nothing left to do. Everything is decided here, before a model is loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quantroll import durable
from quantroll.errors import QuantrollError
from quantroll.locks import OutputLock
from quantroll.rl import metricsfile, savedir
from quantroll.rl.config import TrainConfig


@dataclass(frozen=True)
class Claim:
    """What the run may do with its outputs."""

    resume_step: int | None  # the saved step --load continues after (None: a fresh run)
    replaces_run: bool  # --force over a run: start_over() deletes it at step 0


def _locks(cfg: TrainConfig, log) -> list[OutputLock]:
    locks = []
    if cfg.output.metrics_file:
        locks.append(OutputLock(cfg.output.metrics_file, f"--metrics-file {cfg.output.metrics_file}", is_dir=False, log=log))
    if cfg.output.save:
        locks.append(OutputLock(cfg.output.save, f"--save {cfg.output.save}", log=log))
    if cfg.output.load and not (cfg.output.save and Path(cfg.output.load).absolute() == Path(cfg.output.save).absolute()):
        if not Path(cfg.output.load).is_dir():
            what = "not a directory" if Path(cfg.output.load).exists() else "no such directory"
            raise QuantrollError(f"--load {cfg.output.load}: {what}; point it at a directory written by --save")
        locks.append(OutputLock(cfg.output.load, f"--load {cfg.output.load}", log=log))
    return locks


def _decide(cfg: TrainConfig, log) -> Claim:
    out = cfg.output
    if out.save:
        removed = savedir.clean(out.save)
        if removed:
            log(f"--save {out.save}: removed {len(removed)} leftover(s) of an interrupted save")
    if out.load:
        saved = savedir.latest(out.load)
        if saved is None:
            raise QuantrollError(f"--load {out.load}: no saved state there; point it at a directory written by --save")
        if out.save and Path(out.save).absolute() != Path(out.load).absolute() and savedir.holds_run(out.save):
            raise QuantrollError(f"--save {out.save} holds another run; save the resumed run into --load's directory "
                                 f"({out.load}) or an empty one")
        if saved.step + 1 >= cfg.rollout.num_rollout:
            raise QuantrollError(f"--load {out.load}: the saved run already finished step {saved.step} "
                                 f"({saved.step + 1} steps) and --num-rollout {cfg.rollout.num_rollout} asks for no more; "
                                 f"raise --num-rollout above {saved.step + 1} to continue it")
        return Claim(saved.step, False)
    held = out.save and savedir.holds_run(out.save)
    if held and not out.force:
        try:
            saved = savedir.latest(out.save)
            what = f"a run saved at step {saved.step}" if saved else "a run"
        except QuantrollError:
            what = "a run (in a format this quantroll does not read)"
        raise QuantrollError(f"--save {out.save} holds {what}; resume it with --load {out.save}, or pass --force to "
                             "start over (its state and metrics are deleted)")
    metricsfile.check_fresh(out.metrics_file, out.force)
    return Claim(None, bool(out.force and (held or _has_lines(out.metrics_file))))


def _has_lines(path: str | None) -> bool:
    return bool(path) and Path(path).is_file() and Path(path).stat().st_size > 0


def start_over(cfg: TrainConfig, log) -> None:
    """--force, just before step 0: delete the run the outputs held, and say so."""
    if cfg.output.save and savedir.holds_run(cfg.output.save):
        savedir.wipe(cfg.output.save)
        log(f"--force: deleted the run saved in --save {cfg.output.save}")
    if _has_lines(cfg.output.metrics_file):
        with durable.writing(f"--metrics-file {cfg.output.metrics_file}"):
            durable.write_atomic(cfg.output.metrics_file, b"")
        log(f"--force: overwriting --metrics-file {cfg.output.metrics_file}")


@contextlib.contextmanager
def claim_outputs(cfg: TrainConfig, log=print) -> Iterator[Claim]:
    """Hold the run's locks for the block; yields what it may do."""
    with contextlib.ExitStack() as stack:
        for lock in _locks(cfg, log):
            stack.enter_context(lock)
        yield _decide(cfg, log)

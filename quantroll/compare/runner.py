"""Run the matrix: convert the BF16 checkpoint once per precision, then one ordinary
``quantroll train`` process per run, each with its own directory, log and metrics.

A run is a child process so that one failing (an error, an out-of-memory kill) cannot
take the others down, and so that each run's peak memory is its own. It gets its whole
configuration as ``config.json`` (``quantroll train --config``); the directory's
``run.json`` holds the spec, the same run as a command line, the status and its owner
(pid and host of the compare running it: quantroll/compare/runstatus.py); a finished
run whose command is unchanged is not redone, so an interrupted compare continues where
it stopped. Each run saves its trainer state every ``save_interval`` steps into
``run_dir/state`` (``train --save``, rl/savedir.py); a run that was interrupted (killed,
a time limit, Ctrl-C) or failed, with the same command, resumes from its last saved
step (``train --load``: same weights, optimizer, RNG and metrics file up to that step),
so a 16K-token run cut after step 17 does not start again at step 0; a finished run
asked for more steps (a larger --num-rollout, nothing else changed) continues from its
last save the same way.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from quantroll.checkpoint.atomic import atomic_write_text
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.compare.matrix import RunSpec
from quantroll.compare.rundata import read_metrics
from quantroll.compare.runstatus import interrupted_child, mark_interrupted, stopped_by_signal, terminate_as_interrupt
from quantroll.formats import get_format
from quantroll.outputs import write_owned_file

STATE_DIR = "state"  # the run's --save directory, under its run directory


class RunStates(Protocol):
    """What the runner needs of a run's ``--save`` directory; the command layer gives it
    (rl/savedir.py owns the format, and compare does not import rl)."""

    def saved_step(self, directory: Path) -> int | None:
        """The last step saved there (None: nothing, or a damaged state, to be replaced)."""

    def wipe(self, directory: Path) -> None:
        """Delete the state there, for a fresh start."""


@dataclass(frozen=True)
class CompareSetup:
    out_dir: Path
    source: Path  # the BF16 checkpoint
    model_label: str
    moe: bool
    device: str
    num_rollout: int
    sweep_num_rollout: int
    common_args: tuple[str, ...]  # flags every run gets (task, batch sizes, lr, ...)
    sweep_args: tuple[str, ...]  # flags sweep runs get on top (smaller batches)
    convert_args: dict  # ConvertConfig fields (layers kept in BF16)
    eval_interval: int = 0  # held-out evaluation of the main runs (step 0, every N, last); sweep runs never
    exceptions: dict = field(default_factory=dict)  # precision -> ConvertConfig fields of its BF16 exceptions
    save_interval: int = 0  # every run saves its state every N steps (and at its end) to resume from; 0: never
    states: RunStates | None = None  # reads and wipes those saves (the command layer's; needed with save_interval)


def exception_args(setup: CompareSetup, precision: str) -> dict:
    """The convert fields of a BF16-exceptions checkpoint: the study's own keep rules plus
    the exceptions (patterns added, layer counts the larger of the two)."""
    base, extra = setup.convert_args, setup.exceptions[precision]
    return {**base, "skip": tuple(base.get("skip", ())) + tuple(extra.get("skip", ())),
            **{k: max(base.get(k, 0), extra.get(k, 0)) for k in ("num_layers_at_start_in_bf16",
                                                                  "num_layers_at_end_in_bf16")}}


def prepare_checkpoints(setup: CompareSetup, specs: list[RunSpec], log=print) -> dict[str, Path]:
    """checkpoint key (precision, or precision+bf16x) -> the checkpoint its engine loads (bf16: the source)."""
    out = {"bf16": setup.source}
    for key in sorted({s.checkpoint_key for s in specs} - {"bf16"}):
        precision = key.split("+")[0]
        target = setup.out_dir / "checkpoints" / key.replace("+", "-")
        marker = target / ".quantroll-compare-done"
        args = exception_args(setup, precision) if key.endswith("+bf16x") else setup.convert_args
        made_from = json.dumps({"source": str(Path(setup.source).resolve()), **args}, sort_keys=True)
        if not marker.is_file() or marker.read_text() != made_from:  # absent, interrupted, or another source
            log(f"converting {setup.source} -> {key}")
            convert_checkpoint(setup.source, target, ConvertConfig(format=precision, force=True, progress=False,
                                                                   **args), f"--output-dir {target}")
            write_owned_file(target, marker.name, made_from)  # listed as quantroll's: the next conversion replaces it
        out[key] = target
    return out


def command_for(setup: CompareSetup, spec: RunSpec, checkpoints: dict[str, Path], run_dir: Path) -> list[str]:
    args = [sys.executable, "-m", "quantroll", "train", "--hf-checkpoint", str(checkpoints[spec.checkpoint_key])]
    if spec.precision != "bf16":
        args += ["--ref-load", str(setup.source)]
    steps = setup.sweep_num_rollout if spec.sweep else setup.num_rollout
    args += ["--device", setup.device, "--num-rollout", str(steps), *setup.common_args]
    if spec.sweep:
        args += list(setup.sweep_args)
    elif setup.eval_interval:
        args += ["--eval-interval", str(setup.eval_interval)]
    # absolute: config.json and run.json name the file wherever the run is continued from
    args += spec.train_args() + ["--metrics-file", str((run_dir / "metrics.jsonl").absolute())]
    if setup.save_interval:
        args += ["--save", str((run_dir / STATE_DIR).absolute()), "--save-interval", str(setup.save_interval)]
    return args


OUTPUT_DIR = "<output-dir>"


def portable(cmd: list[str], out_dir: str | Path | None) -> list[str]:
    """``cmd`` with the output directory's absolute path written as OUTPUT_DIR: what makes
    two runs the same run is their settings, not where the directory sits (a compare
    directory moved or copied elsewhere keeps its finished runs and resumes the others)."""
    if not out_dir:
        return list(cmd)
    root = str(Path(out_dir).absolute())
    return [OUTPUT_DIR + x[len(root):] if x == root or x.startswith(root + os.sep) else x for x in cmd]


def _same_command(previous: dict | None, shown: list[str], out_dir: Path, masked: bool = False) -> bool:
    """Whether run.json's command is ``shown`` (its output directory wherever it was then);
    ``masked``: but for the value of --num-rollout (nothing in a step depends on it but the
    evaluation of the last step, which a longer run adds and does not use)."""
    if not previous or previous.get("command") is None:
        return False

    def key(cmd: list[str]) -> list[str]:
        return [("*" if masked and i and cmd[i - 1] == "--num-rollout" else x) for i, x in enumerate(cmd)]

    then = previous.get("output_dir") or out_dir  # run.json of before this field: written where it is now
    return key(portable(previous["command"], then)) == key(portable(shown, out_dir))


def _resume_point(previous: dict | None, shown: list[str], made_from: str, run_dir: Path, states: RunStates,
                  out_dir: Path) -> int | None:
    """The saved step a run continues after, when it is the same run (same command up to
    --num-rollout, same engine checkpoint) and its state holds one (None: start it afresh).
    A finished run asked for more steps continues too: its last save is its last step."""
    if not _same_command(previous, shown, out_dir, masked=True) \
            or previous.get("engine_checkpoint_made_from") != made_from:
        return None
    return states.saved_step(run_dir / STATE_DIR)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _error_line(log: Path, code: int) -> str:
    """The line of the child's log that says why it failed; where it wrote none, how it ended."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    for line in reversed(lines):
        if "error:" in line.lower() or line.startswith(("Traceback", "RuntimeError", "MemoryError")):
            return line
    if lines:
        return lines[-1]
    signal_name = stopped_by_signal(code)
    return f"killed by {signal_name} before writing anything (SIGKILL: out of memory?)" if signal_name else \
        f"exited with code {code} and no output"


def _wait(proc: subprocess.Popen, stop) -> int:
    """The child's exit code; a set ``stop`` (another thread's interrupt) raises KeyboardInterrupt."""
    if stop is None:
        return proc.wait()
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if stop.is_set():
                raise KeyboardInterrupt from None


def run_one(setup: CompareSetup, spec: RunSpec, checkpoints: dict[str, Path], config_of, log=print,
            env: dict[str, str] | None = None, placed: dict | None = None, stop=None) -> dict:
    """Run (or skip, when already done with the same command) one spec; returns run.json.

    ``config_of(argv)``: the TrainConfig that `quantroll train` makes of a command line (the
    command layer owns that parser). The child gets that config as ``run_dir/config.json``
    (``train --config``); run.json keeps the same run as flags, for people. With several
    runs at once (compare/parallel.py): ``env`` is added to the child's environment (its
    GPU), ``placed`` is kept in run.json, and ``stop`` (a threading.Event), once set, stops
    the child and raises KeyboardInterrupt as Ctrl-C would."""
    run_dir = setup.out_dir / "runs" / spec.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = command_for(setup, spec, checkpoints, run_dir)
    shown = ["quantroll"] + cmd[3:]
    metrics = run_dir / "metrics.jsonl"
    steps = setup.sweep_num_rollout if spec.sweep else setup.num_rollout
    marker = checkpoints[spec.checkpoint_key] / ".quantroll-compare-done"
    made_from = marker.read_text() if marker.is_file() else str(Path(setup.source).resolve())
    previous = _read_json(run_dir / "run.json")
    if previous and previous.get("status") == "done" and _same_command(previous, shown, setup.out_dir) \
            and previous.get("engine_checkpoint_made_from") == made_from and len(read_metrics(metrics)[0]) >= steps:
        log(f"  {spec.run_id}: done earlier, kept")
        here = {"command": shown, "output_dir": str(setup.out_dir.absolute())}
        if any(previous.get(k) != v for k, v in here.items()):  # moved: run.json names where it is now
            previous = {**previous, **here}
            atomic_write_text(run_dir / "run.json", json.dumps(previous, indent=2) + "\n")
        return previous
    states = setup.states
    if setup.save_interval and states is None:
        raise ValueError("run_one: setup.save_interval needs setup.states (the command layer's RunStates)")
    resume = _resume_point(previous, shown, made_from, run_dir, states, setup.out_dir) if setup.save_interval else None
    if resume is not None and resume + 1 == steps and _same_command(previous, shown, setup.out_dir) \
            and len(read_metrics(metrics)[0]) >= steps:
        log(f"  {spec.run_id}: finished earlier (killed before it was marked done), kept")  # the last save is the end
        record = {**previous, "status": "done", "error": None, "command": shown,
                  "output_dir": str(setup.out_dir.absolute())}
        atomic_write_text(run_dir / "run.json", json.dumps(record, indent=2) + "\n")
        return record
    if resume is not None and resume + 1 >= steps:
        resume = None  # its state is the end (or past it: fewer steps asked) and nothing is left to do: start over
    if resume is None:  # a fresh start: whatever an older or different run left goes
        metrics.unlink(missing_ok=True)
        if states is not None:
            states.wipe(run_dir / STATE_DIR)
        argv = cmd[3:]
    else:
        verb = "extending" if previous.get("status") == "done" else "resuming"
        log(f"  {spec.run_id}: {verb} after its saved step {resume} of {steps}")
        argv = cmd[3:] + ["--load", str((run_dir / STATE_DIR).absolute())]
    config = run_dir / "config.json"
    atomic_write_text(config, config_of(argv).to_json())
    resumes = (previous.get("resumed_after_steps") or []) + [resume] if resume is not None else []
    record = {"run_id": spec.run_id, **asdict(spec), "status": "running", "error": None, "wall_time_s": None,
              "device": setup.device, "model": setup.model_label, "moe": setup.moe, "command": shown,
              "output_dir": str(setup.out_dir.absolute()),
              "engine_checkpoint_made_from": made_from, "resumed_after_steps": resumes,
              "emulated": None, "pid": os.getpid(), "host": socket.gethostname(),  # the owner (runstatus.py)
              "placement": placed}
    atomic_write_text(run_dir / "run.json", json.dumps(record, indent=2) + "\n")
    start = time.perf_counter()
    # a resume's log follows the last attempt's
    with open(run_dir / "train.log", "a" if resume is not None else "w") as out, terminate_as_interrupt():
        proc = subprocess.Popen([*cmd[:4], "--config", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        try:
            code = _wait(proc, stop)
        except BaseException as err:  # Ctrl-C, SIGTERM: stop the child too; the run resumes from its save next time
            proc.kill()
            proc.wait()
            record.update(mark_interrupted(record, err))
            atomic_write_text(run_dir / "run.json", json.dumps(record, indent=2) + "\n")
            raise
        if code != 0 and (interrupted_child(code) or (stop is not None and stop.is_set())):
            # the signal reached the child first (a process group's SIGTERM or Ctrl-C): the compare hears
            # of it next, and the run resumes from its save as any interrupted run does
            record.update(mark_interrupted(record, KeyboardInterrupt()))
            record["wall_time_s"] = round(time.perf_counter() - start, 2)
            atomic_write_text(run_dir / "run.json", json.dumps(record, indent=2) + "\n")
            return record
    record["wall_time_s"] = round(time.perf_counter() - start, 2)
    written = read_metrics(metrics)[0]
    # the engine labels its precision ("fp8 (emulated)"); a run that wrote nothing falls back on the format
    record["emulated"] = any("emulated" in str(r.get("rollout_precision", "")) for r in written) if written \
        else spec.precision != "bf16" and get_format(spec.precision).emulated_only
    if code == 0 and len(written) >= steps:
        record["status"] = "done"
    else:
        record["status"] = "failed"
        record["error"] = _error_line(run_dir / "train.log", code) if code != 0 else \
            f"exited 0 but wrote {len(written)} of {steps} steps"
    atomic_write_text(run_dir / "run.json", json.dumps(record, indent=2) + "\n")
    return record

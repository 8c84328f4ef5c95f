"""Read what the runner left in OUT/runs/<run_id>/: run.json and metrics.jsonl.

Reading is forgiving where a run can legitimately leave a mess and loud where it
cannot: a run killed mid-write leaves half a last line, which is dropped; any other
unparsable line is dropped too but reported (``bad_lines``), so the report can say so
instead of silently averaging over less data. A resumed run may repeat a step; the
last record of a step wins. Steps come back sorted by step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from quantroll.compare.runstatus import settled
from quantroll.inputs import read_json


@dataclass(frozen=True)
class RunData:
    """One run: its spec (run.json) and its metrics, one dict per RL step."""

    spec: dict
    steps: list[dict]
    truncated_last_line: bool = False  # a killed run's half-written last line was dropped
    bad_lines: tuple[int, ...] = field(default=())  # 1-based numbers of other unparsable lines

    @property
    def run_id(self) -> str:
        return str(self.spec.get("run_id"))


def read_metrics(path: Path) -> tuple[list[dict], bool, tuple[int, ...]]:
    """(steps sorted by step, last line truncated?, numbers of other bad lines)."""
    if not path.exists():
        return [], False, ()
    lines = path.read_text(errors="replace").splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    by_step: dict[int, dict] = {}
    truncated, bad = False, []
    for k, (lineno, line) in enumerate(numbered):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a step record")
        except ValueError:
            if k == len(numbered) - 1:
                truncated = True
            else:
                bad.append(lineno)
            continue
        by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)], truncated, tuple(bad)


def load_run(run_dir: str | Path) -> RunData:
    run_dir = Path(run_dir)
    spec = settled(read_json(run_dir / "run.json", "run record", fix="delete that run's directory to redo it"))
    spec.setdefault("run_id", run_dir.name)
    steps, truncated, bad = read_metrics(run_dir / "metrics.jsonl")
    return RunData(spec=spec, steps=steps, truncated_last_line=truncated, bad_lines=bad)


def load_runs(out_dir: str | Path) -> list[RunData]:
    """Every run under OUT/runs that has a run.json (a directory without one is not a run yet)."""
    runs_dir = Path(out_dir) / "runs"
    if not runs_dir.is_dir():
        return []
    return [load_run(d) for d in sorted(runs_dir.iterdir()) if (d / "run.json").is_file()]

"""`compare` rerun into one --output-dir with another matrix reports only the runs of
the matrix asked for: the older runs stay on disk, listed as stale, never ranked against
the new baseline. (The runs here are synthetic: run_one is replaced by a writer of
finished runs, so that the matrix logic is tested without training.)"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np

from quantroll.cli import main
from quantroll.compare import runner
from tests.compare.synth import random_steps, write_run


def _fake_run_one(setup, spec, checkpoints, config_of, log=print, **placed):
    rng = np.random.default_rng(spec.seed)
    record = {"run_id": spec.run_id, **asdict(spec), "status": "done", "error": None, "wall_time_s": 1.0,
              "device": "cpu", "model": setup.model_label, "moe": False, "command": ["quantroll", "train"],
              "emulated": spec.precision != "bf16"}
    write_run(setup.out_dir, record, random_steps(rng, 2, 0.002 if spec.precision == "bf16" else 0.05, 1.0, 0.1,
                                                  spec.precision, spec.response_len))
    return record


def test_a_changed_matrix_reports_only_its_own_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "run_one", _fake_run_one)
    monkeypatch.setattr(runner, "prepare_checkpoints", lambda setup, specs, log=print: {
        p: setup.source for p in ("bf16", "fp8", "mxfp8", "nvfp4")})
    out = tmp_path / "c"
    assert main(["compare", "--output-dir", str(out), "--precisions", "bf16,fp8", "--modes", "1", "--seeds",
                 "1,2"]) == 0
    first = json.loads((out / "summary.json").read_text())
    old_ids = {r["run_id"] for r in first["runs"]}
    assert len(old_ids) == 6 and first["stale_runs"] == []
    assert main(["compare", "--output-dir", str(out), "--precisions", "bf16", "--seeds", "3"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["run_id"] for r in summary["runs"]] == ["bf16-baseline-none-seed3"]
    assert summary["stale_runs"] == sorted(old_ids)
    assert all(g["precision"] == "bf16" for g in summary["groups"])  # nothing of the old matrix is ranked
    assert any("belong to an earlier matrix" in w for w in summary["warnings"])
    assert "belong to an earlier matrix" in (out / "report.md").read_text()
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(old_ids | {"bf16-baseline-none-seed3"})
    assert not (out / ".quantroll.lock").exists()

"""bench/long_study_learn.py: the learning jobs' curves read from each run's own record, in
compare's group order, and the study's figure (the README's)."""

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from long_study_learn import learn_bands, learn_curves, learn_progress, study_figure  # noqa: E402


def _run(root, job, run_id, precision, correction, seed, status, rewards):
    d = root / job / "compare" / "runs" / run_id
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "precision": precision, "unified": False,
                                            "kv_cache_dtype": "bf16", "correction": correction, "seed": seed,
                                            "status": status}))
    steps = [{"step": i, "reward_mean": r} for i, r in enumerate(rewards)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))


def test_curves_by_group_in_compares_order_and_the_figure(tmp_path):
    _run(tmp_path, "learn-4k", "fp8-rollout-tis-seed1", "fp8", "tis", 1, "done", [0.4, 0.5, 0.6])
    _run(tmp_path, "learn-4k", "bf16-baseline-none-seed2", "bf16", "none", 2, "done", [0.5, 0.6, 0.7])
    _run(tmp_path, "learn-4k", "bf16-baseline-none-seed1", "bf16", "none", 1, "done", [0.5, 0.7, 0.8])
    _run(tmp_path, "learn-4k", "fp8-rollout-none-seed1", "fp8", "none", 1, "interrupted", [0.4])
    curves = learn_curves(tmp_path, "learn-4k")
    assert [(c["group"], c["seed"], c["status"]) for c in curves] == [
        ("bf16 / none", 1, "done"), ("bf16 / none", 2, "done"),
        ("mode 1: fp8 rollout, BF16 train / none", 1, "interrupted"),
        ("mode 1: fp8 rollout, BF16 train / tis", 1, "done")]
    assert curves[1]["reward"] == [0.5, 0.6, 0.7]
    assert learn_curves(tmp_path, "learn-16k") == []
    # the figure's data by hand: bf16's two seeds as mean / lowest / highest per step; the interrupted run left out
    bands = learn_bands(curves)
    assert [(b["group"], b["seeds"]) for b in bands] == [("bf16 / none", 2), ("mode 1: fp8 rollout, BF16 train / tis", 1)]
    assert bands[0]["mean"] == pytest.approx([0.5, 0.65, 0.75])
    assert bands[0]["low"] == pytest.approx([0.5, 0.6, 0.7]) and bands[0]["high"] == pytest.approx([0.5, 0.7, 0.8])
    assert bands[1]["low"] == bands[1]["high"] == bands[1]["mean"] == pytest.approx([0.4, 0.5, 0.6])
    learning = {"learn-4k": {"bands": bands, "progress": learn_progress(curves)}, "learn-16k": {}}
    assert study_figure([], learning, tmp_path / "plots" / "study.png")
    assert (tmp_path / "plots" / "study.png").stat().st_size > 0
    assert not study_figure([], {"learn-4k": {}, "learn-16k": {"bands": [], "progress": []}}, tmp_path / "none.png")


def test_the_report_shows_the_figure(tmp_path):
    from long_study_report import build

    _run(tmp_path / "jobs", "learn-16k", "bf16-baseline-none-seed1", "bf16", "none", 1, "done", [0.3, 0.4])
    (tmp_path / "jobs" / "learn-16k" / "calls.jsonl").write_text(json.dumps(_CALL) + "\n")
    build(tmp_path / "jobs", tmp_path / "out", None)
    assert "![the study](plots/study.png)" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "plots" / "study.png").is_file()


_CALL = {"job": "learn-16k", "date": "2026-12-07", "gpu": "H100", "commit": "0" * 40, "status": "continue",
         "seconds": 540, "commands": ["python3 -m quantroll compare --groups bf16"]}


def test_a_job_whose_raw_folder_is_gone_is_reported_from_its_extract(tmp_path):
    """The report keeps each job's extract (jobs/JOB.json) and, once the raw folder is lost (a new
    checkout, a bare machine), reports the job from it exactly as before; a raw folder wins."""
    from long_study_report import build

    jobs, out = tmp_path / "jobs", tmp_path / "out"
    _run(jobs, "learn-16k", "bf16-baseline-none-seed1", "bf16", "none", 1, "done", [0.3, 0.4])
    _run(jobs, "learn-16k", "fp8-rollout-none-seed1", "fp8", "none", 1, "interrupted", [0.2])
    (jobs / "learn-16k" / "calls.jsonl").write_text(json.dumps(_CALL) + "\n")
    first = build(jobs, out, None)
    md = (out / "report.md").read_text()
    assert "| learn-16k | 2026-12-07 | H100 |" in md and "Jobs with no results here: sft, calibrate, gap, learn-4k." in md
    assert "| fp8-rollout-none-seed1 | interrupted | 1 | 0.2 | 0.2 |" in md
    saved = json.loads((out / "jobs" / "learn-16k.json").read_text())
    assert [r["status"] for r in saved["progress"]] == ["done", "interrupted"] and saved["bands"][0]["mean"] == pytest.approx([0.3, 0.4])
    shutil.rmtree(jobs / "learn-16k")
    assert build(jobs, out, None) == first
    assert (out / "report.md").read_text() == md
    # a folder a call left no record in does not replace the extract
    (jobs / "learn-16k").mkdir()
    build(jobs, out, None)
    assert (out / "report.md").read_text() == md
    # a newer raw folder does
    _run(jobs, "learn-16k", "fp8-rollout-none-seed1", "fp8", "none", 1, "done", [0.2, 0.35])
    (jobs / "learn-16k" / "calls.jsonl").write_text(json.dumps(_CALL) + "\n")
    build(jobs, out, None)
    assert [r["status"] for r in json.loads((out / "jobs" / "learn-16k.json").read_text())["progress"]] == ["done"]


def test_a_metrics_line_cut_by_a_kill_is_dropped_not_fatal(tmp_path):
    _run(tmp_path, "learn-16k", "bf16-baseline-none-seed1", "bf16", "none", 1, "interrupted", [0.3, 0.4])
    metrics = tmp_path / "learn-16k" / "compare" / "runs" / "bf16-baseline-none-seed1" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 2, "reward_me')
    assert learn_curves(tmp_path, "learn-16k")[0]["reward"] == [0.3, 0.4]


def _compare_with_a_stale_answer(jobs, job, stale: str) -> str:
    """A finished compare of real (synthetic) runs whose saved summary.json carries ``stale`` as its
    answer, as a summary written by an earlier rule would; returns the answer the current rule gives."""
    from quantroll.compare.summary import load_runs, summarize
    from tests.compare.synth import write_constant_runs

    compare = jobs / job / "compare"
    write_constant_runs(compare, {"bf16": [(0.001, 0.50, 0.8), (0.001, 0.56, 0.8)], "none": [(0.3, 0.58, 0.8)]})
    summary = summarize(load_runs(compare))
    (mode,) = summary["recommendation"]["modes"]
    fresh, mode["text"] = mode["text"], stale
    (compare / "summary.json").write_text(json.dumps(summary))
    return fresh


def test_a_learning_job_answers_only_once_its_last_call_is_done(tmp_path):
    """Run one at a time, each run's compare leaves a summary.json of the runs so far: while the job's
    last call says 'continue' the report shows its runs' progress, not that partial summary as the answer."""
    from long_study_report import build

    jobs, out = tmp_path / "jobs", tmp_path / "out"
    fresh = _compare_with_a_stale_answer(jobs, "learn-16k", "a partial answer")
    (jobs / "learn-16k" / "calls.jsonl").write_text(json.dumps(_CALL) + "\n")
    build(jobs, out, None)
    md = (out / "report.md").read_text()
    assert "The learn-16k job has not finished its compare." in md and fresh not in md
    assert "| bf16-0 | done | 3 | 0.5 | 0.5 |" in md
    (jobs / "learn-16k" / "calls.jsonl").write_text(json.dumps(_CALL) + "\n" + json.dumps({**_CALL, "status": "done"}) + "\n")
    build(jobs, out, None)
    assert f"- {fresh}" in (out / "report.md").read_text()


def test_a_finished_learning_job_is_answered_by_the_current_rule(tmp_path):
    """A rule mended after the GPU runs reaches the report from the saved groups: the job's answer, its
    compare's own report and the extract are made again, from the raw folder or, once it is gone,
    from the compare summary the report kept."""
    from long_study_report import build

    jobs, out = tmp_path / "jobs", tmp_path / "out"
    fresh = _compare_with_a_stale_answer(jobs, "learn-4k", "an answer by an older rule")
    (jobs / "learn-4k" / "calls.jsonl").write_text(json.dumps({**_CALL, "job": "learn-4k", "status": "done"}) + "\n")

    def answered() -> list[str]:
        kept = json.loads((out / "learn-4k" / "summary.json").read_text())
        extract = json.loads((out / "jobs" / "learn-4k.json").read_text())
        report = (out / "report.md").read_text() + (out / "learn-4k" / "report.md").read_text()
        assert "older rule" not in report
        return [m["text"] for m in kept["recommendation"]["modes"]] + extract["result"]["answer"]

    build(jobs, out, None)
    assert answered() == [fresh, fresh]
    assert (out / "learn-4k" / "report.md").read_text().splitlines()[2] == f"- {fresh}"
    shutil.rmtree(jobs / "learn-4k")  # the raw folder is gone; the kept copy, made stale, is judged again
    for path in (out / "learn-4k" / "summary.json", out / "jobs" / "learn-4k.json"):
        path.write_text(path.read_text().replace(json.dumps(fresh)[1:-1], "an answer by an older rule"))
    build(jobs, out, None)
    assert answered() == [fresh, fresh]

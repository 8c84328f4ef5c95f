"""bench/long_study_learn.py: the learning jobs' curves read from each run's own record, in
compare's group order, and the study's figure (the README's)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from long_study_learn import learn_curves, study_figure  # noqa: E402


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
    assert study_figure([], {"learn-4k": curves, "learn-16k": []}, tmp_path / "plots" / "study.png")
    assert (tmp_path / "plots" / "study.png").stat().st_size > 0
    assert not study_figure([], {"learn-4k": [], "learn-16k": []}, tmp_path / "none.png")


def test_the_report_shows_the_figure(tmp_path):
    from long_study_report import build

    _run(tmp_path / "jobs", "learn-16k", "bf16-baseline-none-seed1", "bf16", "none", 1, "done", [0.3, 0.4])
    build(tmp_path / "jobs", tmp_path / "out", None)
    assert "![the study](plots/study.png)" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "plots" / "study.png").is_file()


def test_a_metrics_line_cut_by_a_kill_is_dropped_not_fatal(tmp_path):
    _run(tmp_path, "learn-16k", "bf16-baseline-none-seed1", "bf16", "none", 1, "interrupted", [0.3, 0.4])
    metrics = tmp_path / "learn-16k" / "compare" / "runs" / "bf16-baseline-none-seed1" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 2, "reward_me')
    assert learn_curves(tmp_path, "learn-16k")[0]["reward"] == [0.3, 0.4]

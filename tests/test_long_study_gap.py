"""bench/long_study_gap.py: the long-study report's gap growth by length, against numbers
worked by hand, and its plot."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from long_study_gap import gap_growth, gap_plot, gap_rows, sequence_kl  # noqa: E402


def _row(length, label, absdiff, kl, response_len, chi2_seq):
    return {"length": length, "label": label, "response_len_mean": response_len,
            "train_rollout_logprob_abs_diff@0": absdiff, "train_rollout_kl@0": kl, "chi2_seq@0": chi2_seq}


def test_growth_by_hand():
    rows = [_row(4096, "fp8", 1e-3, 4e-5, 4000, 0.5), _row(16384, "fp8", 1.2e-3, 5e-5, 16000, 2.0),
            _row(8192, "fp8", 1.1e-3, 4.5e-5, 8000, -0.02),
            _row(4096, "bf16", 3e-4, 5e-6, 4000, -0.01), _row(16384, "bf16", 3e-4, 6e-6, 16000, 0.1)]
    lengths, growth = gap_growth(rows)
    assert lengths == [4096, 8192, 16384]
    by = {(g["label"], g["level"]): g for g in growth}
    assert by["fp8", "token abs logp diff"]["values"] == {4096: 1e-3, 8192: 1.1e-3, 16384: 1.2e-3}
    assert by["fp8", "token abs logp diff"]["growth"] == pytest.approx(1.2)
    # sequence KL: 4e-5 x 4000 = 0.16 nats, 5e-5 x 16000 = 0.8: x5
    assert by["fp8", "sequence KL (nats)"]["values"][4096] == pytest.approx(0.16)
    assert by["fp8", "sequence KL (nats)"]["growth"] == pytest.approx(5.0)
    assert by["fp8", "chi2_seq"]["values"][8192] == -0.02 and by["fp8", "chi2_seq"]["growth"] == pytest.approx(4.0)
    assert by["bf16", "chi2_seq"]["growth"] is None  # a negative estimate at 4K has no ratio
    assert by["bf16", "token abs logp diff"]["values"][8192] is None  # bf16 has no 8K run here
    assert sequence_kl({"train_rollout_kl@0": None, "response_len_mean": 10}) is None


def test_a_cell_of_two_seeds_grows_from_their_mean():
    rows = [_row(4096, "fp8+kv", 1e-3, 4e-5, 4000, 0.5), _row(16384, "fp8+kv", 2e-3, 2.2e-4, 16000, 3.0),
            _row(16384, "fp8+kv", 1e-3, 6e-5, 16000, -1.0)]
    _, growth = gap_growth(rows)
    by = {g["level"]: g for g in growth}
    assert by["token abs logp diff"]["values"][16384] == pytest.approx(1.5e-3)
    assert by["token abs logp diff"]["growth"] == pytest.approx(1.5)
    # (2.2e-4 x 16000 + 6e-5 x 16000) / 2 = 2.24 nats, against 4e-5 x 4000 = 0.16: x14
    assert by["sequence KL (nats)"]["values"][16384] == pytest.approx(2.24)
    assert by["sequence KL (nats)"]["growth"] == pytest.approx(14.0)
    assert by["chi2_seq"]["values"][16384] == pytest.approx(1.0) and by["chi2_seq"]["growth"] == pytest.approx(2.0)


def test_rows_read_from_a_gap_job_and_plotted(tmp_path):
    for length, kl in ((4096, 4e-5), (8192, 6e-5)):
        where = tmp_path / "gap" / str(length) / "compare"
        (where / "runs" / "fp8-run").mkdir(parents=True)
        (where / "summary.json").write_text(json.dumps({"runs": [{"run_id": "fp8-run", "label": "fp8",
                                                                  "status": "done"}]}))
        steps = [{"step": s, "response_len_mean": 100.0, "entropy": 0.04, "train_rollout_logprob_abs_diff": 1e-3,
                  "train_rollout_kl": kl * (s + 1), "log_ppl_diff": 1e-4, "chi2_token": 1e-4, "chi2_seq": 0.3}
                 for s in (0, 1)]
        (where / "runs" / "fp8-run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    rows = gap_rows(tmp_path)
    assert [r["length"] for r in rows] == [4096, 8192]
    assert rows[1]["train_rollout_kl@0"] == 6e-5 and rows[1]["train_rollout_kl@1"] == 1.2e-4
    assert gap_growth(rows)[1][1]["growth"] == pytest.approx(1.5)
    assert gap_plot(rows, tmp_path / "plots" / "gap.png") and (tmp_path / "plots" / "gap.png").stat().st_size > 0
    assert not gap_plot([], tmp_path / "none.png")


def test_an_unfinished_learning_job_shows_each_runs_progress(tmp_path):
    from long_study_learn import learn_curves, learn_progress

    runs = tmp_path / "learn-4k" / "compare" / "runs"
    (runs / "bf16-seed1").mkdir(parents=True)
    (runs / "fp8-seed1").mkdir()
    spec = {"unified": False, "kv_cache_dtype": "bf16", "correction": "none", "seed": 1}
    (runs / "bf16-seed1" / "run.json").write_text(json.dumps({**spec, "precision": "bf16", "status": "done"}))
    steps = [{"step": 0, "reward_mean": 0.5, "eval_engine_reward": 0.8, "eval_trainer_reward": 0.9,
              "eval_trainer_accuracy": 0.75},
             {"step": 1, "reward_mean": 0.6},
             {"step": 2, "reward_mean": 0.7, "eval_engine_reward": 0.85, "eval_trainer_reward": 0.95,
              "eval_trainer_accuracy": 0.8125}]
    (runs / "bf16-seed1" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (runs / "fp8-seed1" / "run.json").write_text(json.dumps({**spec, "precision": "fp8", "status": "interrupted"}))
    assert learn_progress(learn_curves(tmp_path, "learn-4k")) == [
        {"run_id": "bf16-seed1", "status": "done", "steps": 3, "reward_first": 0.5, "reward_last": 0.7,
         "heldout_accuracy_first": 0.75, "heldout_accuracy_last": 0.8125,
         "heldout_reward_first": 0.9, "heldout_reward_last": 0.95},
        {"run_id": "fp8-seed1", "status": "interrupted", "steps": 0, "reward_first": None, "reward_last": None,
         "heldout_accuracy_first": None, "heldout_accuracy_last": None,
         "heldout_reward_first": None, "heldout_reward_last": None}]
    assert learn_progress(learn_curves(tmp_path, "learn-16k")) == []


def test_the_findings_written_beside_the_report_come_first_and_are_kept(tmp_path):
    from long_study_report import build

    out = tmp_path / "report"
    (tmp_path / "jobs").mkdir()
    build(tmp_path / "jobs", out, None)
    assert "## Findings" not in (out / "report.md").read_text()  # none written: none shown
    (out / "findings.md").write_text("- At 4K, **FP8 rollout** stays within BF16's seed spread.\n")
    build(tmp_path / "jobs", out, None)
    md = (out / "report.md").read_text()
    assert md.index("## Findings") < md.index("- At 4K, **FP8 rollout**") < md.index("## What ran where")
    assert "At 4K, <b>FP8 rollout</b> stays" in (out / "report.html").read_text()
    assert (out / "findings.md").read_text() == "- At 4K, **FP8 rollout** stays within BF16's seed spread.\n"

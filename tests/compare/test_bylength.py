"""By-length reporting (compare/bylength.py): each group's reward, held-out accuracy and
gap metrics per length bucket, checked against a direct recomputation from the step
records; and end to end, a `compare --groups` study whose summary.json and reports carry
one by-length table per group (CPU, the built-in model, 2 steps)."""

import json
import random
import statistics

import pytest

from quantroll.cli import main
from quantroll.compare.bylength import by_length_tables, group_by_length, run_by_length
from quantroll.metrics.by_length import BUCKET_METRICS, TOKEN_LEVEL
from quantroll.rl.config import TrainConfig

BUCKETS = ("4", "8", "16")


def _steps(rng: random.Random, n: int, eval_at=(0, 2)) -> list[dict]:
    out = []
    for step in range(n):
        held = [b for b in BUCKETS if rng.random() < 0.8]  # a bucket may be missing from a step
        s = {"step": step,
             "reward_by_len": {b: {"n": rng.randint(1, 9), "reward": rng.random(), "accuracy": rng.random()}
                               for b in held},
             "by_response_len": {b: {"tokens": rng.randint(10, 99), "seqs": rng.randint(1, 5),
                                     **{m: rng.random() for m in BUCKET_METRICS}} for b in held}}
        if step in eval_at:
            for side in ("engine", "trainer"):
                s[f"eval_{side}_by_len"] = {b: {"n": 4, "reward": rng.random(), "accuracy": rng.random()}
                                            for b in BUCKETS}
        out.append(s)
    return out


def _weighted(items, value, weight):
    items = [x for x in items if x is not None]
    total = sum(weight(x) for x in items)
    return sum(value(x) * weight(x) for x in items) / total if total else None


def _stats(values):
    vals = [v for v in values if v is not None]
    return (statistics.fmean(vals) if vals else None, statistics.stdev(vals) if len(vals) > 1 else None, len(vals))


def _close(got: dict, want: tuple):
    mean, std, n = want
    assert got["n"] == n
    assert got["mean"] == (None if mean is None else pytest.approx(mean, rel=1e-12))
    assert got["std"] == (None if std is None else pytest.approx(std, rel=1e-12))


def test_group_by_length_against_a_direct_recomputation():
    rng = random.Random(7)
    runs = [_steps(rng, 6), _steps(rng, 6), _steps(rng, 4, eval_at=(0, 3))]
    got = group_by_length([run_by_length(r) for r in runs])
    assert list(got["buckets"]) == list(BUCKETS) and got["eval_steps"] == [0, 2, 3]
    last = 1  # reward_window: 5 steps or a quarter of the run, at least 1 -> 1 for 4 and 6 steps
    for b in BUCKETS:
        row = got["buckets"][b]
        rw = [[s["reward_by_len"].get(b) for s in r] for r in runs]
        _close(row["reward"], _stats(_weighted(x, lambda v: v["reward"], lambda v: v["n"]) for x in rw))
        _close(row["accuracy"], _stats(_weighted(x, lambda v: v["accuracy"], lambda v: v["n"]) for x in rw))
        _close(row["reward_last"], _stats(_weighted(x[-last:], lambda v: v["reward"], lambda v: v["n"]) for x in rw))
        assert row["samples"] == sum(v["n"] for x in rw for v in x if v)
        for side in ("engine", "trainer"):
            evals = [[s for s in r if f"eval_{side}_by_len" in s] for r in runs]
            _close(row[f"eval_first_{side}_accuracy"], _stats(e[0][f"eval_{side}_by_len"][b]["accuracy"] for e in evals))
            _close(row[f"eval_last_{side}_reward"], _stats(e[-1][f"eval_{side}_by_len"][b]["reward"] for e in evals))
        gaps = [[s["by_response_len"].get(b) for s in r] for r in runs]
        for m in BUCKET_METRICS:
            w = "tokens" if m in TOKEN_LEVEL else "seqs"
            _close(row["gap"][m], _stats(_weighted(x, lambda v: v[m], lambda v: v[w]) for x in gaps))
            _close(row["gap_step0"][m], _stats(x[0][m] if x[0] else None for x in gaps))
        assert row["gap_tokens"] == sum(v["tokens"] for x in gaps for v in x if v)


def test_one_table_per_group_with_data_and_none_without():
    rng = random.Random(3)
    per_run = group_by_length([run_by_length(_steps(rng, 3))])
    summary = {"groups": [{"id": "a / none", "label": "a", "correction": "none", "by_length": per_run},
                          {"id": "b / tis", "label": "b", "correction": "tis", "by_length": group_by_length([])}]}
    (table,) = by_length_tables(summary)
    assert table.title == "By length: a / none" and [r[0] for r in table.rows] == ["4-7", "8-15", "16-31"]
    assert len(table.headers) == 9 + len(BUCKET_METRICS) and all(len(r) == len(table.headers) for r in table.rows)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    out = tmp_path_factory.mktemp("grouped") / "study"
    assert main(["compare", "--output-dir", str(out), "--groups", "bf16,fp8+tis-seq", "--seeds", "1",
                 "--num-rollout", "2", "--eval-interval", "1", "--save-interval", "0", "--train-args",
                 "--rollout-batch-size 4 --n-samples-per-prompt 2 --eval-size 8"]) == 0
    return out


@pytest.mark.slow
def test_grouped_study_reports_every_group_by_length(grouped):
    runs = sorted(p.name for p in (grouped / "runs").iterdir())
    assert runs == ["bf16-baseline-none-seed1", "fp8-rollout-tis-seq-seed1"]
    bf16 = TrainConfig.from_json((grouped / "runs" / runs[0] / "config.json").read_text(), "c")
    tis = TrainConfig.from_json((grouped / "runs" / runs[1] / "config.json").read_text(), "c")
    assert not bf16.correction.enabled and (tis.correction.enabled, tis.correction.level) == (True, "sequence")
    assert bf16.output.save is None  # --save-interval 0: no states
    summary = json.loads((grouped / "summary.json").read_text())
    report, page = (grouped / "report.md").read_text(), (grouped / "report.html").read_text()
    for g in summary["groups"]:
        run = g["run_ids"][0]
        steps = [json.loads(x) for x in (grouped / "runs" / run / "metrics.jsonl").read_text().splitlines()]
        buckets = g["by_length"]["buckets"]
        assert buckets and sum(b["samples"] for b in buckets.values()) == 2 * 4 * 2
        # the buckets recombine into the run's reward over steps (every step has the same samples)
        overall = sum(b["reward"]["mean"] * b["samples"] for b in buckets.values()) / (2 * 4 * 2)
        assert overall == pytest.approx(statistics.fmean(s["reward_mean"] for s in steps), rel=1e-9)
        evals = [s for s in steps if "eval_trainer_by_len" in s]
        for k, b in buckets.items():
            if k in evals[-1]["eval_trainer_by_len"]:
                assert b["eval_last_trainer_accuracy"]["mean"] == evals[-1]["eval_trainer_by_len"][k]["accuracy"]
        assert sum(b["gap_tokens"] for b in buckets.values()) == sum(s["mismatch_tokens"] for s in steps)
        assert f"By length: {g['label']} / {g['correction']}" in report
        assert f"By length: {g['label']} / {g['correction']}" in page

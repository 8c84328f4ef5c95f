"""summarize() against an independent recomputation from the raw JSONL of a synthetic matrix.

Every expected number is recomputed here with numpy from the lines the synthetic runs
wrote (tests/compare/synth.py); nothing is hard-coded. Tolerance rel 1e-9: the two
sides sum the same float64 numbers in possibly different orders.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from quantroll.compare.labels import mode_label
from quantroll.compare.stats import NO_DIFFERENCE, NO_SPREAD, difference, stats
from quantroll.compare.speed import update_over_copy
from quantroll.compare.summary import load_runs, summarize
from quantroll.compare.tables import time_table
from tests.compare.synth import (BUCKET_KEYS, GAP_KEYS, MOE_LAYERS, RESPONSE_LEN, build_matrix, raw_runs, spec,
                                 write_run)

LABELS = {("bf16", False): "bf16", ("fp8", False): "mode 1: fp8 rollout, BF16 train",
          ("fp8", True): "mode 2: block FP8", ("mxfp8", True): "mode 3: MXFP8", ("nvfp4", True): "mode 4: NVFP4",
          ("mxfp8", False): "mode 1: mxfp8 rollout, BF16 train"}
REL = 1e-9


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = build_matrix(tmp_path_factory.mktemp("compare"))
    return out, summarize(load_runs(out)), raw_runs(out)


def num(v):
    return float(v) if v is not None else None


def expect(values):
    """(mean, std ddof=1 or None, n) over the finite values, with numpy."""
    vals = np.array([num(v) for v in values if v is not None and np.isfinite(num(v))], dtype=np.float64)
    if vals.size == 0:
        return None, None, 0
    return float(vals.mean()), (float(vals.std(ddof=1)) if vals.size > 1 else None), int(vals.size)


def check(st: dict, values) -> None:
    m, s, n = expect(values)
    assert st["n"] == n
    assert st["mean"] == (pytest.approx(m, rel=REL) if m is not None else None)
    assert st["std"] == (pytest.approx(s, rel=REL, abs=1e-15) if s is not None else None)


def groups_raw(raw) -> dict[str, list[tuple[dict, list[dict]]]]:
    """group id -> [(spec, steps)] of the done, non-sweep runs: the grouping the report must do."""
    out: dict[str, list] = {}
    for sp, steps in raw.values():
        if sp["status"] == "done" and not sp["sweep"]:
            out.setdefault(f"{LABELS[(sp['precision'], sp['unified'])]} / {sp['correction']}", []).append((sp, steps))
    return out


def by_id(summary):
    return {g["id"]: g for g in summary["groups"]}


def test_mode_label():
    for (precision, unified), label in LABELS.items():
        assert mode_label(precision, unified) == label
    assert mode_label("bf16", True) == "bf16"


def test_load_runs_reads_every_run_and_drops_a_truncated_last_line(matrix):
    out, _, raw = matrix
    runs = {r.run_id: r for r in load_runs(out)}
    assert set(runs) == set(raw)
    for run_id, (sp, steps) in raw.items():
        assert runs[run_id].spec == sp
        assert runs[run_id].steps == steps
        assert runs[run_id].truncated_last_line == (run_id == "fp8-r-tis-s1")
        assert runs[run_id].bad_lines == ()


def test_groups_are_done_non_sweep_runs_by_mode_and_correction(matrix):
    _, summary, raw = matrix
    expected = groups_raw(raw)
    groups = by_id(summary)
    assert set(groups) == set(expected)
    for gid, members in expected.items():
        g = groups[gid]
        assert sorted(g["run_ids"]) == sorted(sp["run_id"] for sp, _ in members)
        assert sorted(g["seeds"]) == sorted(sp["seed"] for sp, _ in members)
        assert g["emulated"] == any(sp["emulated"] for sp, _ in members)
        assert g["label"].endswith("(emulated)") == g["emulated"]
        assert g["response_len"] == RESPONSE_LEN
        assert g["loss_agg"] == ["token-mean"]
    assert summary["baseline"] == "bf16 / none"


def test_gap_at_step0_and_over_steps(matrix):
    _, summary, raw = matrix
    groups = by_id(summary)
    assert tuple(summary["gap_metrics"]) == GAP_KEYS
    for gid, members in groups_raw(raw).items():
        for key in GAP_KEYS:
            check(groups[gid]["gap_step0"][key], [steps[0][key] for _, steps in members])
            check(groups[gid]["gap_mean"][key], [np.mean([s[key] for s in steps]) for _, steps in members])
        # the entropy beside each gap table: step 0's, and the mean over steps
        check(groups[gid]["entropy"]["gap_step0"], [steps[0]["entropy"] for _, steps in members])
        check(groups[gid]["entropy"]["gap_mean"], [np.mean([s["entropy"] for s in steps]) for _, steps in members])


def test_gap_tables_show_the_entropy_beside_the_gap(matrix):
    from quantroll.compare.cells import cell
    from quantroll.compare.tables import build_tables

    _, summary, _ = matrix
    tables = {t.key: t for t in build_tables(summary)}
    for key in ("gap_step0", "gap_mean"):
        t = tables[key]
        at = t.headers.index("entropy")
        assert at == 3 and [row[at] for row in t.rows] == [cell(g["entropy"][key]) for g in summary["groups"]]
    assert "entropy" in dict(tables["gap_step0"].legend)


def test_reward_curve_last_k_and_mean(matrix):
    _, summary, raw = matrix
    groups = by_id(summary)
    for gid, members in groups_raw(raw).items():
        g = groups[gid]
        w = max(1, min(5, len(members[0][1]) // 4))  # the ends a reward rise is judged on, and k of the answer
        assert "final" not in g["reward"] and "accuracy" not in g  # one step's reward; the duplicate of reward
        assert {len(steps) for _, steps in members} == {len(members[0][1])} and g["reward"]["last_k"] == w
        check(g["reward"]["first_steps"], [np.mean([s["reward_mean"] for s in steps[:w]]) for _, steps in members])
        check(g["reward"]["last_steps"], [np.mean([s["reward_mean"] for s in steps[-w:]]) for _, steps in members])
        check(g["reward"]["mean"], [np.mean([s["reward_mean"] for s in steps]) for _, steps in members])
        n_steps = max(len(steps) for _, steps in members)
        assert [p["step"] for p in g["curves"]["reward_mean"]] == list(range(n_steps))
        for p in g["curves"]["reward_mean"]:
            check(p, [steps[p["step"]]["reward_mean"] for _, steps in members if len(steps) > p["step"]])
        for p in g["curves"]["train_rollout_logprob_abs_diff"]:
            check(p, [steps[p["step"]]["train_rollout_logprob_abs_diff"] for _, steps in members])
        if g["id"] != summary["baseline"]:
            base = groups[summary["baseline"]]
            d = g["reward_vs_bf16"]
            assert d["diff"] == pytest.approx(g["reward"]["mean"]["mean"] - base["reward"]["mean"]["mean"], rel=REL)
            assert d["spread"] == pytest.approx(math.hypot(g["reward"]["mean"]["std"], base["reward"]["mean"]["std"]))
            assert d["significant"] == (abs(d["diff"]) > d["spread"])


def test_eval_routing_memory_and_every_metric(matrix):
    _, summary, raw = matrix
    groups = by_id(summary)
    for gid, members in groups_raw(raw).items():
        g = groups[gid]
        evals = [[s for s in steps if "eval_engine_accuracy" in s] for _, steps in members]
        check(g["eval"]["engine"], [e[-1]["eval_engine_accuracy"] for e in evals])
        check(g["eval"]["trainer"], [e[-1]["eval_trainer_accuracy"] for e in evals])
        check(g["eval"]["first_engine"], [e[0]["eval_engine_accuracy"] for e in evals])
        check(g["eval"]["first_trainer"], [e[0]["eval_trainer_accuracy"] for e in evals])
        assert g["eval"]["steps"] == sorted({e[-1]["step"] for e in evals})
        assert g["eval"]["first_steps"] == [0]
        for key in ("eval_engine_accuracy", "eval_trainer_accuracy"):  # the curve has exactly the eval steps
            assert [p["step"] for p in g["curves"][key]] == sorted({s["step"] for e in evals for s in e})
            for p in g["curves"][key]:
                check(p, [s[key] for e in evals for s in e if s["step"] == p["step"]])
        assert g["extremes"]["tis_ratio_min"] == min(s["tis_ratio_min"] for _, steps in members for s in steps)
        assert g["extremes"]["tis_ratio_max"] == max(s["tis_ratio_max"] for _, steps in members for s in steps)
        assert g["routing"]["layers"] == list(MOE_LAYERS)
        for layer in MOE_LAYERS:
            key = f"routing_agreement_layer{layer}"
            check(g["routing"]["step0"][str(layer)], [steps[0][key] for _, steps in members])
            check(g["routing"]["mean"][str(layer)], [np.mean([s[key] for s in steps]) for _, steps in members])
        check(g["memory"]["peak_memory_gib"], [max(s["peak_memory_gib"] for s in steps) for _, steps in members])
        check(g["memory"]["kv_cache_capacity_tokens"],
              [np.mean([s["kv_cache_capacity_tokens"] for s in steps]) for _, steps in members])
        assert g["memory"]["engine_weight_gib"]["n"] == 0
        # every float metric, NaN (written as "nan") left out of the mean
        skip = {"step", "rollout_precision", "weight_version", "mismatch_tokens", "mismatch_seqs", "loss_agg",
                "by_response_len"}
        keys = {k for _, steps in members for s in steps for k in s} - skip
        assert set(g["metrics_mean"]) == keys
        for k in keys:
            per_run = []
            for _, steps in members:
                vals = [float(s[k]) for s in steps if k in s and math.isfinite(float(s[k]))]
                per_run.append(np.mean(vals) if vals else None)
            check(g["metrics_mean"][k], per_run)
    assert by_id(summary)["mode 1: fp8 rollout, BF16 train / none"]["metrics_mean"]["grad_norm"]["n"] == 3


def test_times_exclude_warmup_and_break_even(matrix):
    _, summary, raw = matrix
    groups = by_id(summary)
    expected = groups_raw(raw)

    def per_run(steps, key):
        return np.mean([s[key] for s in steps[1:]])

    def group_mean(gid, f):
        return np.mean([f(steps) for _, steps in expected[gid]])

    for gid, members in expected.items():
        for key in ("rollout_time", "train_time", "weight_quantize_time", "weight_load_time", "weight_copy_time",
                    "rollout_tokens_per_s"):
            check(groups[gid]["time"][key], [per_run(steps, key) for _, steps in members])
        assert groups[gid]["time"]["warmup_excluded"]
        copies = group_mean(gid, lambda st: per_run(st, "weight_quantize_time") + per_run(st, "weight_load_time")) \
            / group_mean(gid, lambda st: per_run(st, "weight_copy_time"))
        assert update_over_copy(groups[gid]) == pytest.approx(copies, rel=REL)
        row = next(r for r in time_table(summary).rows if r[0] == groups[gid]["label"]
                   and r[1] == groups[gid]["correction"])
        assert row[6] == f"{copies:.3g}x"
    base = summary["baseline"]
    assert groups[base]["speed"] is None
    def rollout(gid):
        return group_mean(gid, lambda st: per_run(st, "rollout_time"))

    def sync(gid):
        return group_mean(gid, lambda st: per_run(st, "weight_quantize_time") + per_run(st, "weight_load_time"))

    def tokens_of(steps):  # tokens generated per timed step: rollout_time * tokens/s
        return [s["rollout_time"] * s["rollout_tokens_per_s"] for s in steps[1:]]

    def per_token(gid):
        return group_mean(gid, lambda st: sum(s["rollout_time"] for s in st[1:]) / sum(tokens_of(st)))

    def tokens(gid):
        return group_mean(gid, lambda st: np.mean(tokens_of(st)))
    seen_never = seen_length = False
    for gid in expected:
        if gid == base:
            continue
        sp = groups[gid]["speed"]
        saved, extra = rollout(base) - rollout(gid), sync(gid) - sync(base)
        assert sp["speedup"] == pytest.approx(rollout(base) / rollout(gid), rel=REL)
        assert sp["tokens_per_s_ratio"] == pytest.approx(
            group_mean(gid, lambda st: per_run(st, "rollout_tokens_per_s"))
            / group_mean(base, lambda st: per_run(st, "rollout_tokens_per_s")), rel=REL)
        assert sp["saved_s"] == pytest.approx(saved, rel=REL)
        assert sp["extra_sync_s"] == pytest.approx(extra, rel=REL)
        assert sp["net_s"] == pytest.approx(saved - extra, rel=REL)
        assert sp["pays"] == (saved > extra)
        if per_token(base) > per_token(gid):
            seen_length = True
            assert sp["break_even_response_len"] == pytest.approx(
                extra * RESPONSE_LEN / ((per_token(base) - per_token(gid)) * tokens(gid)), rel=1e-7)
        else:
            seen_never = True
            assert sp["break_even_response_len"] is None and sp["break_even_note"].startswith("never")
    assert seen_never and seen_length  # the synthetic matrix covers both branches


def test_run_rows_failed_and_running(matrix):
    _, summary, raw = matrix
    rows = {r["run_id"]: r for r in summary["runs"]}
    assert set(rows) == set(raw)
    for run_id, (sp, steps) in raw.items():
        r = rows[run_id]
        assert (r["status"], r["error"], r["seed"], r["num_steps"]) == (sp["status"], sp["error"], sp["seed"], len(steps))
        assert r["gap_step0"] == pytest.approx(steps[0]["train_rollout_logprob_abs_diff"], rel=REL)
        w = max(1, min(5, len(steps) // 4))
        assert r["reward_last"] == pytest.approx(np.mean([s["reward_mean"] for s in steps[-w:]]), rel=REL)
    failed = [sp for sp, _ in raw.values() if sp["status"] == "failed"]
    assert [(f["run_id"], f["error"]) for f in summary["failed"]] == [(sp["run_id"], sp["error"]) for sp in failed]
    assert rows["fp8-r-tis-s1"]["truncated_last_line"]
    assert any("fp8-r-r3-s0" in w for w in summary["warnings"])  # the running run is named as left out


def test_sweep_gap_vs_response_len(matrix):
    _, summary, raw = matrix
    expected: dict[tuple, list[dict]] = {}
    for sp, steps in raw.values():
        if sp["sweep"] and sp["status"] == "done":
            expected.setdefault((LABELS[(sp["precision"], sp["unified"])], sp["response_len"]), []).append(steps[0])
    rows = {(s["mode"], s["response_len"]): s for s in summary["sweep"]}
    assert set(rows) == set(expected)
    for key, step0s in expected.items():
        for metric in GAP_KEYS:
            check(rows[key]["gap_step0"][metric], [s[metric] for s in step0s])
    modes = [s["mode"] for s in summary["sweep"]]
    assert modes == sorted(modes, key=lambda m: m != "bf16")  # baseline first
    for mode in set(modes):
        lens = [s["response_len"] for s in summary["sweep"] if s["mode"] == mode]
        assert lens == sorted(lens)


def _by_len_reference(steps: list[dict]) -> dict[str, dict]:
    """Per bucket over a run's steps: tokens/seqs summed, token-level metrics token-weighted,
    sequence-level ones sequence-weighted (numpy)."""
    token_level = ("train_rollout_logprob_abs_diff", "train_rollout_kl", "chi2_token")
    out = {}
    for b in {b for s in steps for b in s.get("by_response_len", {})}:
        rows = [s["by_response_len"][b] for s in steps if b in s.get("by_response_len", {})]
        out[b] = {"tokens": sum(r["tokens"] for r in rows), "seqs": sum(r["seqs"] for r in rows)}
        for k in BUCKET_KEYS:
            w = np.array([r["tokens" if k in token_level else "seqs"] for r in rows], dtype=np.float64)
            out[b][k] = float(np.dot(w, [r[k] for r in rows]) / w.sum())
    return out


def test_gap_by_response_length_is_weighted_over_steps_then_stats_over_seeds(matrix):
    _, summary, raw = matrix
    groups = by_id(summary)
    for gid, members in groups_raw(raw).items():
        per_run = [_by_len_reference(steps) for _, steps in members]
        buckets = sorted({b for r in per_run for b in r}, key=int)
        got = groups[gid]["gap_by_len"]
        assert list(got) == buckets
        for b in buckets:
            assert got[b]["tokens"] == sum(r[b]["tokens"] for r in per_run if b in r)
            for k in BUCKET_KEYS:
                check(got[b][k], [r[b][k] for r in per_run if b in r])
    for row in summary["sweep"]:
        assert row["gap_by_len"]  # sweep runs are split by length too


def test_summary_is_strict_json(matrix):
    _, summary, _ = matrix
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary


# --- significance ----------------------------------------------------------------------


def test_difference_rule():
    a, b = stats([1.0, 1.1, 0.9]), stats([2.0, 2.1, 1.9])
    d = difference(b, a)
    assert d["diff"] == pytest.approx(1.0) and d["spread"] == pytest.approx(math.hypot(0.1, 0.1))
    assert d["significant"] and d["note"] == "significant"
    d = difference(stats([1.0, 2.0, 3.0]), stats([1.5, 2.5, 3.5]))
    assert d["significant"] is False and d["note"] == NO_DIFFERENCE
    d = difference(stats([1.0]), stats([5.0, 5.1]))
    assert d["significant"] is None and d["spread"] is None and d["note"] == NO_SPREAD


def test_without_baseline_nothing_is_compared_to_bf16(tmp_path):
    write_run(tmp_path, spec("fp8-0", "fp8", False, "none", 0), [{"step": 0, "reward_mean": 0.5, "rollout_time": 1.0}])
    summary = summarize(load_runs(tmp_path))
    assert summary["baseline"] is None
    assert summary["groups"][0]["speed"] is None and summary["groups"][0]["reward_vs_bf16"] is None
    assert any("no bf16 baseline" in w for w in summary["warnings"])
    (mode,) = summary["recommendation"]["modes"]
    assert mode["choice"] == "none" and mode["acceptable"] is None  # always a choice; nothing to judge against
    assert "not judged vs BF16: no BF16 baseline finished" in mode["text"]


def test_emulated_also_read_from_rollout_precision(tmp_path):
    steps = [{"step": 0, "rollout_precision": "mxfp8 (emulated)", "reward_mean": 0.5, "rollout_time": 1.0}]
    write_run(tmp_path, spec("mx-0", "mxfp8", True, "none", 0, emulated=False), steps)
    summary = summarize(load_runs(tmp_path))
    assert summary["groups"][0]["label"] == "mode 3: MXFP8 (emulated)"
    assert summary["runs"][0]["emulated"]

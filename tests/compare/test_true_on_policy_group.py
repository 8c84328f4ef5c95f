"""The opt-in true-on-policy group of `quantroll compare`: the matrix it adds (and the
default matrix unchanged), and the side-by-side table of gap and cost."""

from quantroll.compare.groups import spec_key
from quantroll.compare.matrix import build_matrix
from quantroll.compare.tables import true_on_policy_table


def test_default_matrix_has_no_true_on_policy_runs():
    assert not any(s.true_on_policy for s in build_matrix("bf16,fp8", "none,tis", "1,2", "1,2", 8, False))


def test_the_flag_adds_bf16_and_mode2_twins_with_the_train_flag():
    base = build_matrix("bf16,fp8", "none,tis", "1,2", "1,2", 8, False)
    specs = build_matrix("bf16,fp8", "none,tis", "1,2", "1,2", 8, False, true_on_policy=True)
    top = [s for s in specs if s.true_on_policy]
    assert specs[: len(base)] == base
    assert sorted((s.precision, s.unified, s.correction, s.seed) for s in top) == [
        ("bf16", False, "none", 1), ("bf16", False, "none", 2), ("fp8", True, "none", 1), ("fp8", True, "none", 2)]
    assert all("--true-on-policy-mode" in s.train_args() for s in top)
    assert len({s.run_id for s in specs}) == len(specs)
    # mode 1 alone has nothing the mode can hold for but the baseline
    only1 = [s for s in build_matrix("bf16,fp8", "none", "1", "1", 8, False, true_on_policy=True) if s.true_on_policy]
    assert [(s.precision, s.unified) for s in only1] == [("bf16", False)]


def _group(label, precision, unified, top, gap, tps, train):
    stat = lambda x: {"mean": x, "std": None, "n": 1}  # noqa: E731
    return {"label": label, "precision": precision, "unified": unified, "kv_cache_dtype": "bf16", "correction": "none",
            "true_on_policy": top, "moe": True, "gap_step0": {"train_rollout_logprob_abs_diff": stat(gap)},
            "gap_mean": {"train_rollout_logprob_abs_diff": stat(gap)},
            "time": {"rollout_tokens_per_s": stat(tps), "train_time": stat(train)}}


def test_table_puts_each_precision_with_and_without_the_mode_side_by_side():
    assert spec_key({"precision": "bf16", "true_on_policy": True})[0] == "bf16 (true on-policy)"
    summary = {"groups": [_group("bf16", "bf16", False, False, 3e-7, 3000.0, 0.4),
                          _group("bf16 (true on-policy)", "bf16", False, True, 0.0, 1500.0, 0.8)]}
    table = true_on_policy_table(summary)
    row = table.rows[0]
    assert row[0] == "bf16" and row[2].startswith("0") and row[7] == "0.5x" and row[10] == "2x"
    assert any("R3" in n and "no-op" in n for n in table.notes)
    assert true_on_policy_table({"groups": summary["groups"][:1]}) is None

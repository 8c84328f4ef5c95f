"""The recommendation rule on synthetic summaries: a correction only when it matters, the
numbers either way, and each mode judged against BF16 with the stated tolerance.

Expected choices follow from the numbers by the rule as docs/compare.md states it (a
correction is chosen over none only when its reward over the last k steps, or its last
held-out accuracy, is closer to BF16's than none's by more than both the seed spread
sqrt(std_a^2 + std_b^2) and 25% of none's difference from BF16; the gap never decides);
thresholds are recomputed with numpy, never copied from the code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantroll.compare.recommend import FACTOR, FLOOR, HELD_OUT, REWARD
from quantroll.compare.summary import load_runs, summarize
from tests.compare.synth import write_constant_runs

TIS_QUIET = {"tis_clipfrac": 0.0, "tis_ratio_min": 0.99, "tis_ratio_max": 1.002, "tis": 1.0}


def mode_of(out, values, extra=None) -> tuple[dict, dict]:
    write_constant_runs(out, values, extra)
    summary = summarize(load_runs(out))
    (mode,) = summary["recommendation"]["modes"]
    return mode, summary


def spread(a, b) -> float:
    return math.hypot(np.std(a, ddof=1), np.std(b, ddof=1))


def test_nothing_distinguishable_answers_no_correction_with_the_numbers(tmp_path):
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.50, 0.40), (0.002, 0.60, 0.50), (0.001, 0.40, 0.45)],
                                 "none": [(0.10, 0.40, 0.42), (0.30, 0.60, 0.50), (0.20, 0.50, 0.44)],
                                 "tis": [(0.15, 0.45, 0.41), (0.25, 0.55, 0.49), (0.18, 0.50, 0.46)]},
                      {"tis": TIS_QUIET})
    assert mode["choice"] == "none" and mode["passed"] == []
    assert "no correction needed: none is distinguishable" in mode["text"]
    (test,) = [t for t in mode["tests"]["tis"] if t["criterion"] == REWARD]
    assert test["value"] == pytest.approx(0.5) and test["reference"] == pytest.approx(0.5)
    assert f"needs > {test['need']:.3g}" in mode["text"]  # the numbers behind "none is distinguishable"
    assert "The answer rests on 3 seeds per group" in mode["text"]
    assert "TIS clipped 0.0% of tokens: the ratios never left [0.99, 1.002]" in mode["text"]
    assert mode["acceptable"] is True and mode["text"].startswith("mode 1: fp8 rollout, BF16 train: acceptable vs BF16")


def test_tis_closer_in_recent_reward_beyond_spread_and_margin_is_chosen(tmp_path):
    bf16, none, tis = [0.50, 0.52, 0.48], [0.20, 0.22, 0.18], [0.50, 0.49, 0.51]
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, r) for r in bf16], "none": [(0.30, r) for r in none],
                                 "tis": [(0.30, r) for r in tis]})
    assert mode["choice"] == "tis" and mode["passed"] == ["tis"]
    (test,) = [t for t in mode["tests"]["tis"] if t["criterion"] == REWARD]
    ref_diff = abs(np.mean(none) - np.mean(bf16))
    assert test["need"] == pytest.approx(max(spread(tis, none), 0.25 * ref_diff))
    assert test["gain"] == pytest.approx(ref_diff - abs(np.mean(tis) - np.mean(bf16)))
    assert "tis (closer to BF16 than none by more than the seed spread and 25% of the difference" in mode["text"]


def test_closer_beyond_the_spread_but_within_a_quarter_of_the_difference_is_not_chosen(tmp_path):
    bf16, none, tis = [0.500, 0.501, 0.499], [0.300, 0.301, 0.299], [0.320, 0.321, 0.319]
    gain = abs(np.mean(none) - np.mean(bf16)) - abs(np.mean(tis) - np.mean(bf16))
    assert spread(tis, none) < gain < 0.25 * abs(np.mean(none) - np.mean(bf16))  # the case this test is about
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, r) for r in bf16], "none": [(0.30, r) for r in none],
                                 "tis": [(0.30, r) for r in tis]})
    assert mode["choice"] == "none" and "none is distinguishable" in mode["text"]


def test_the_gap_is_reported_but_never_chooses(tmp_path):
    """The issue's case: TIS narrows the gap (0.0201 vs 0.0217) while outcomes tie: none."""
    mode, summary = mode_of(tmp_path, {"bf16": [(1e-7, 0.50), (1e-7, 0.60), (1e-7, 0.40)],
                                       "none": [(0.0217, 0.45), (0.0218, 0.55), (0.0216, 0.50)],
                                       "tis": [(0.0201, 0.45), (0.0202, 0.55), (0.0200, 0.50)]})
    assert mode["choice"] == "none"
    assert "mean |logp diff| over steps (reported, not chosen on): none 0.0217, tis 0.0201" in mode["text"]
    tis = next(c for c in mode["candidates"] if c["correction"] == "tis")
    assert tis["gap over steps"]["mean"] == pytest.approx(0.0201)


def test_held_out_accuracy_alone_can_choose(tmp_path):
    bf16, none, tis = [0.60, 0.61, 0.59], [0.30, 0.31, 0.29], [0.58, 0.59, 0.60]
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.5, a) for a in bf16], "none": [(0.3, 0.5, a) for a in none],
                                 "tis": [(0.3, 0.5, a) for a in tis]})
    assert mode["choice"] == "tis"
    (test,) = [t for t in mode["tests"]["tis"] if t["criterion"] == HELD_OUT]
    assert test["closer"] and test["need"] == pytest.approx(max(spread(tis, none), 0.25 * 0.30))


def test_closer_on_one_criterion_but_as_much_farther_on_the_other_is_not_chosen(tmp_path):
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.50, 0.60), (0.001, 0.51, 0.61), (0.001, 0.49, 0.59)],
                                 "none": [(0.3, 0.20, 0.60), (0.3, 0.21, 0.61), (0.3, 0.19, 0.59)],
                                 "tis": [(0.3, 0.50, 0.20), (0.3, 0.51, 0.21), (0.3, 0.49, 0.19)]})
    tests = {t["criterion"]: t for t in mode["tests"]["tis"]}
    assert tests[REWARD]["closer"] and tests[HELD_OUT]["farther"]
    assert mode["choice"] == "none"


def test_not_acceptable_beyond_twice_the_spread(tmp_path):
    bf16, none = [0.60, 0.62, 0.58], [0.30, 0.31, 0.29]
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, r, 0.5) for r in bf16], "none": [(0.3, r, 0.5) for r in none]})
    (check,) = [c for c in mode["acceptance"]["checks"] if c["criterion"] == REWARD]
    tol = max(FACTOR * spread(none, bf16), FLOOR)
    assert check["tolerance"] == pytest.approx(tol) and abs(np.mean(none) - np.mean(bf16)) > tol
    assert mode["acceptable"] is False and "NOT acceptable vs BF16" in mode["text"]
    assert mode["choice"] == "none" and "only none was run" in mode["text"]


def test_within_the_absolute_floor_is_acceptable_even_with_a_tiny_spread(tmp_path):
    bf16, none = [0.600, 0.601, 0.599], [0.585, 0.586, 0.584]  # 0.015 apart, spread ~0.0014
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, r, 0.5) for r in bf16], "none": [(0.3, r, 0.49) for r in none]})
    assert FACTOR * spread(none, bf16) < abs(np.mean(none) - np.mean(bf16)) < FLOOR
    assert mode["acceptable"] is True


def test_held_out_accuracy_counts_for_acceptability(tmp_path):
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.5, 0.60), (0.001, 0.5, 0.61)],
                                 "none": [(0.3, 0.5, 0.30), (0.3, 0.5, 0.31)]})
    (acc,) = [c for c in mode["acceptance"]["checks"] if c["criterion"] == "held-out accuracy"]
    assert not acc["within"] and mode["acceptable"] is False


def test_one_seed_decides_by_the_point_estimate_and_says_so(tmp_path):
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.50, 0.5)], "none": [(0.30, 0.49, 0.5)],
                                 "tis": [(0.10, 0.20, 0.5)]})
    assert mode["choice"] == "none" and mode["one_seed"]  # no spread: tis (far worse anyway) cannot pass
    assert "no seed spread (1 seed)" in mode["text"] and "rests on 1 seed per group" in mode["text"]
    assert mode["acceptable"] is True  # |0.49 - 0.50| <= 0.02 on the point estimate
    assert f"by the point estimate (1 seed: spread unknown, tolerance {FLOOR:g})" in mode["text"]
    mode, _ = mode_of(tmp_path / "far", {"bf16": [(0.001, 0.50, 0.5)], "none": [(0.30, 0.45, 0.5)]})
    assert mode["acceptable"] is False  # 0.05 > 0.02


def test_one_seed_against_several_takes_bf16s_spread_as_its_own(tmp_path):
    """A single run judged against BF16's seeds: tolerance 2 x sqrt(2) x BF16's std, not 0.02 (which a
    BF16 rerun inside BF16's own spread would fail)."""
    bf16 = [0.50, 0.56, 0.44]  # std 0.06: a rerun of BF16 lands anywhere in ~[0.40, 0.60]
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, r, 0.5) for r in bf16], "none": [(0.3, 0.56, 0.5)]})
    (check,) = [c for c in mode["acceptance"]["checks"] if c["criterion"] == REWARD]
    tol = FACTOR * math.sqrt(2.0) * np.std(bf16, ddof=1)
    assert check["spread_from"] == "BF16's" and check["tolerance"] == pytest.approx(tol)
    assert FLOOR < 0.06 < tol  # beyond 0.02, within BF16's own variation
    assert mode["acceptable"] is True and mode["one_seed"]
    assert "1 seed: spread taken from BF16's seeds, sqrt(2) x their std" in mode["text"]
    mode, _ = mode_of(tmp_path / "far", {"bf16": [(0.001, r, 0.5) for r in bf16], "none": [(0.3, 0.50 + 1.1 * tol, 0.5)]})
    assert mode["acceptable"] is False  # still beyond twice the assumed spread


def test_the_choice_column_never_points_at_a_mode_that_failed(tmp_path):
    from quantroll.compare.answer import recommendation_table

    def choice_cells(out, values):
        _, summary = mode_of(out, values)
        return [row[-1] for row in recommendation_table(summary).rows[1:]]  # after the baseline's row

    bf16 = [(0.001, 0.60, 0.5), (0.001, 0.61, 0.5)]
    assert choice_cells(tmp_path / "ok", {"bf16": bf16, "none": [(0.3, 0.60, 0.5), (0.3, 0.61, 0.5)]}) == ["<- use"]
    assert choice_cells(tmp_path / "bad", {"bf16": bf16, "none": [(0.3, 0.30, 0.5), (0.3, 0.31, 0.5)]}) == \
        ["its best; mode not acceptable"]


def test_every_mode_gets_a_choice_and_the_answer_leads_the_report(tmp_path):
    from quantroll.compare.markdown import md_text
    from quantroll.compare.report import terminal_tables, write_report

    mode, summary = mode_of(tmp_path, {"bf16": [(0.001, 0.5, 0.5), (0.002, 0.52, 0.5)],
                                       "none": [(0.3, 0.5, 0.5), (0.31, 0.51, 0.5)],
                                       "tis": [(0.3, 0.5, 0.5), (0.31, 0.52, 0.5)]})
    assert mode["choice"] in ("none", "tis")
    write_report(tmp_path, summary)
    md = (tmp_path / "report.md").read_text().splitlines()
    assert md[2] == f"- {md_text(mode['text'])}"  # right under the title, before any table
    assert terminal_tables(summary).splitlines()[2] == f"- {mode['text']}"
    # then how to add the modes not run (2, 3, 4 here: mode 1 only), then the rule, stated
    assert md[3].startswith("- Not run: modes 2 (block FP8), 3 (MXFP8), 4 (NVFP4). Add with: quantroll compare "
                            "--precisions bf16,fp8,mxfp8,nvfp4 --modes 1,2,3,4")
    assert "labels those runs (emulated)" in md[3]
    assert md[4] == f"- {md_text(summary['recommendation']['rule'])}"


def test_memorisation_warning_when_reward_rises_but_held_out_does_not(tmp_path):
    from tests.compare.synth import spec, write_run

    def run(out, corr, seed, rewards, accs):
        steps = [{"step": i, "reward_mean": r, "train_rollout_logprob_abs_diff": 0.01} for i, r in enumerate(rewards)]
        for i, a in accs.items():
            steps[i].update(eval_engine_accuracy=a, eval_trainer_accuracy=a)
        write_run(out, spec(f"{corr}-{seed}", "bf16", False, "none", seed, moe=False), steps)

    run(tmp_path / "a", "bf16", 0, [0.2, 0.4, 0.6], {0: 0.45, 2: 0.44})
    run(tmp_path / "a", "bf16", 1, [0.25, 0.45, 0.65], {0: 0.47, 2: 0.46})
    summary = summarize(load_runs(tmp_path / "a"))
    warnings = summary["heldout_warnings"]
    assert any("training reward rose" in w and "held-out accuracy did not" in w for w in warnings)
    assert not any("training reward rose" in w for w in summary["warnings"])  # not twice: it leads the report
    run(tmp_path / "b", "bf16", 0, [0.2, 0.4, 0.6], {0: 0.45, 2: 0.60})
    run(tmp_path / "b", "bf16", 1, [0.25, 0.45, 0.65], {0: 0.47, 2: 0.62})
    assert not any("training reward rose" in w for w in summarize(load_runs(tmp_path / "b"))["heldout_warnings"])


def test_a_small_clip_share_is_never_printed_as_zero(tmp_path):
    clipping = {"tis_clipfrac": 0.00012, "tis_ratio_min": 0.3, "tis_ratio_max": 2.27}
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.5)], "none": [(0.3, 0.5)], "tis": [(0.3, 0.5)]},
                      {"tis": clipping})
    assert "TIS clipped 0.012% of tokens; the ratios ranged over [0.3, 2.27]" in mode["text"]
    assert "never left" not in mode["text"]


def test_sequence_level_weighting_says_its_unit_and_the_sample_size_it_left(tmp_path):
    """Sequence TIS clips sequences, not tokens, and at long lengths its product ratios shrink the
    batch: the line names the unit and, below 99%, the effective sample size (mean over steps)."""
    seq = {"tis_clipfrac": 0.11, "tis_ratio_min": 0.05, "tis_ratio_max": 7.4, "ess_ratio": 0.62}
    token = {"tis_clipfrac": 0.0, "tis_ratio_min": 0.9, "tis_ratio_max": 1.1, "ess_ratio": 0.9999}
    mask = {"masked_fraction": 0.2, "tis_ratio_min": 0.05, "tis_ratio_max": 7.4, "ess_ratio": 0.5}
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.5)], "none": [(0.3, 0.5)], "tis": [(0.3, 0.5)],
                                 "tis-seq": [(0.3, 0.5)], "mask-geo": [(0.3, 0.5)]},
                      {"tis-seq": seq, "tis": token, "mask-geo": mask})
    assert ("TIS at sequence level clipped 11.0% of sequences; the ratios ranged over [0.05, 7.4]; its weights "
            "left an effective sample size of 62% of the batch's sequences") in mode["text"]
    assert "TIS clipped 0.0% of tokens: the ratios never left [0.9, 1.1]" in mode["text"]
    assert "[0.9, 1.1]; its weights" not in mode["text"]  # 99.99%: no note
    assert ("mask at geometric-mean level dropped 20.0% of tokens; the ratios ranged over [0.05, 7.4]; its weights "
            "left an effective sample size of 50% of the batch's sequences") in mode["text"]

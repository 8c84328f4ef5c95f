"""The recommendation rule on synthetic summaries: it always chooses, says why, and judges
each mode against BF16 with the stated tolerance.

Expected choices follow from the numbers by the rule as docs/compare.md states it (criteria
in order: final reward, held-out accuracy, gap; each drops what is farther from BF16
than the closest correction beyond sqrt(std_a^2 + std_b^2); the cheapest of the rest);
tolerances are recomputed with numpy, never copied from the code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantroll.compare.recommend import FACTOR, FLOOR
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


def test_all_insignificant_chooses_the_cheapest_and_says_why_with_the_evidence(tmp_path):
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.50, 0.40), (0.002, 0.60, 0.50), (0.001, 0.40, 0.45)],
                                 "none": [(0.10, 0.40, 0.42), (0.30, 0.60, 0.50), (0.20, 0.50, 0.44)],
                                 "tis": [(0.15, 0.45, 0.41), (0.25, 0.55, 0.49), (0.18, 0.50, 0.46)]},
                      {"tis": TIS_QUIET})
    assert mode["choice"] == "none" and mode["kept"] == ["none", "tis"]
    assert all(not s["dropped"] for s in mode["steps"])
    assert "no significant difference between corrections" in mode["text"] and "the cheapest" in mode["text"]
    assert "TIS clipped 0.0% of tokens: the ratios never left [0.99, 1.002]" in mode["text"]
    assert mode["acceptable"] is True and mode["text"].startswith("mode 1: fp8 rollout, BF16 train: acceptable vs BF16")


def test_tis_significantly_closer_in_final_reward_is_chosen(tmp_path):
    bf16, none, tis = [0.50, 0.52, 0.48], [0.20, 0.22, 0.18], [0.50, 0.49, 0.51]
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, r) for r in bf16], "none": [(0.30, r) for r in none],
                                 "tis": [(0.30, r) for r in tis]})
    assert mode["choice"] == "tis"
    (step,) = [s for s in mode["steps"] if s["dropped"]]
    assert step["criterion"] == "final reward" and step["best"] == "tis"
    (dropped,) = step["dropped"]
    assert dropped["correction"] == "none" and dropped["spread"] == pytest.approx(spread(none, tis))
    assert "tis is closer to BF16 than none in final reward beyond the seed spread between corrections" in mode["text"]


def test_final_reward_decides_before_the_gap(tmp_path):
    """none is closer in final reward, tis in gap: the reward criterion comes first."""
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.50), (0.002, 0.52), (0.001, 0.48)],
                                 "none": [(0.30, 0.50), (0.31, 0.51), (0.29, 0.49)],
                                 "tis": [(0.10, 0.20), (0.11, 0.22), (0.12, 0.18)]})
    assert mode["choice"] == "none"
    assert [s["criterion"] for s in mode["steps"] if s["dropped"]] == ["final reward"]


def test_the_gap_decides_when_outcomes_tie(tmp_path):
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.50), (0.002, 0.60), (0.001, 0.40)],
                                 "none": [(0.30, 0.45), (0.32, 0.55), (0.31, 0.50)],
                                 "tis": [(0.10, 0.45), (0.11, 0.55), (0.12, 0.50)]})
    assert mode["choice"] == "tis"
    assert [s["criterion"] for s in mode["steps"] if s["dropped"]] == ["gap over steps"]


def test_not_acceptable_beyond_twice_the_spread(tmp_path):
    bf16, none = [0.60, 0.62, 0.58], [0.30, 0.31, 0.29]
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, r, 0.5) for r in bf16], "none": [(0.3, r, 0.5) for r in none]})
    (check,) = [c for c in mode["acceptance"]["checks"] if c["criterion"] == "final reward"]
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
    assert mode["choice"] == "none" and mode["one_seed"]  # nothing can be shown farther: the cheapest
    assert "1 seed: spread unknown" in mode["text"]
    assert mode["acceptable"] is True  # |0.49 - 0.50| <= 0.02 on the point estimate
    assert f"by the point estimate (1 seed: spread unknown, tolerance {FLOOR:g})" in mode["text"]
    mode, _ = mode_of(tmp_path / "far", {"bf16": [(0.001, 0.50, 0.5)], "none": [(0.30, 0.45, 0.5)]})
    assert mode["acceptable"] is False  # 0.05 > 0.02


def test_every_mode_gets_a_choice_and_the_answer_leads_the_report(tmp_path):
    from quantroll.compare.report import terminal_tables, write_report

    mode, summary = mode_of(tmp_path, {"bf16": [(0.001, 0.5, 0.5), (0.002, 0.52, 0.5)],
                                       "none": [(0.3, 0.5, 0.5), (0.31, 0.51, 0.5)],
                                       "tis": [(0.3, 0.5, 0.5), (0.31, 0.52, 0.5)]})
    assert mode["choice"] in ("none", "tis")
    write_report(tmp_path, summary)
    md = (tmp_path / "report.md").read_text().splitlines()
    assert md[2] == f"- {mode['text']}"  # right under the title, before any table
    assert terminal_tables(summary).splitlines()[2] == f"- {mode['text']}"
    assert md[3] == f"- {summary['recommendation']['rule']}".replace("<", "\\<")  # the rule, stated


def test_memorisation_warning_when_reward_rises_but_held_out_does_not(tmp_path):
    from tests.compare.synth import spec, write_run

    def run(out, corr, seed, rewards, accs):
        steps = [{"step": i, "reward_mean": r, "train_rollout_logprob_abs_diff": 0.01} for i, r in enumerate(rewards)]
        for i, a in accs.items():
            steps[i].update(eval_engine_accuracy=a, eval_trainer_accuracy=a)
        write_run(out, spec(f"{corr}-{seed}", "bf16", False, "none", seed, moe=False), steps)

    run(tmp_path / "a", "bf16", 0, [0.2, 0.4, 0.6], {0: 0.45, 2: 0.44})
    run(tmp_path / "a", "bf16", 1, [0.25, 0.45, 0.65], {0: 0.47, 2: 0.46})
    warnings = summarize(load_runs(tmp_path / "a"))["warnings"]
    assert any("training reward rose" in w and "held-out accuracy did not" in w for w in warnings)
    run(tmp_path / "b", "bf16", 0, [0.2, 0.4, 0.6], {0: 0.45, 2: 0.60})
    run(tmp_path / "b", "bf16", 1, [0.25, 0.45, 0.65], {0: 0.47, 2: 0.62})
    assert not any("training reward rose" in w for w in summarize(load_runs(tmp_path / "b"))["warnings"])


def test_a_small_clip_share_is_never_printed_as_zero(tmp_path):
    clipping = {"tis_clipfrac": 0.00012, "tis_ratio_min": 0.3, "tis_ratio_max": 2.27}
    mode, _ = mode_of(tmp_path, {"bf16": [(0.001, 0.5)], "none": [(0.3, 0.5)], "tis": [(0.3, 0.5)]},
                      {"tis": clipping})
    assert "TIS clipped 0.012% of tokens; the ratios ranged over [0.3, 2.27]" in mode["text"]
    assert "never left" not in mode["text"]

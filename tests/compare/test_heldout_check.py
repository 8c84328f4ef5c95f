"""CI's check that the BF16 baseline keeps its held-out accuracy, and the warning that leads
the report when it does not (issue 41: a baseline that unlearns cannot rank corrections).

Thresholds are recomputed here (step 0's accuracy minus the seed spread of the two evals,
ddof=1), never read back from the code.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from quantroll.compare.answer import answer
from quantroll.compare.heldout_check import main, verdict
from quantroll.compare.summary import load_runs, summarize
from tests.compare.synth import spec, write_run

REPO = Path(__file__).resolve().parents[2]


def study(out: Path, bf16_last: list[float], first: float = 0.45) -> dict:
    """bf16 and fp8 (mode 1) runs, one per held-out accuracy at the last eval; evals at steps 0 and 3."""
    for precision in ("bf16", "fp8"):
        for seed, last in enumerate(bf16_last):
            steps = [{"step": i, "reward_mean": 0.3 + 0.01 * i, "train_rollout_logprob_abs_diff": 0.01}
                     for i in range(4)]
            steps[0].update(eval_engine_accuracy=first, eval_trainer_accuracy=first)
            steps[3].update(eval_engine_accuracy=last, eval_trainer_accuracy=last)
            write_run(out, spec(f"{precision}-{seed}", precision, False, "none", seed, moe=False), steps)
    return summarize(load_runs(out))


def test_a_baseline_that_unlearns_fails_with_the_numbers_and_leads_the_report(tmp_path):
    summary = study(tmp_path, [0.25, 0.27])
    code, line = verdict(summary)
    floor = 0.45 - math.hypot(0.0, np.std([0.25, 0.27], ddof=1))
    assert np.mean([0.25, 0.27]) < floor and code == 1
    assert "BF16 held-out accuracy 0.45 at step 0 -> 0.26 at step 3 (2 seeds" in line and "unlearned" in line
    assert f"floor {floor:.3g}" in line
    lines = answer(summary)
    assert lines[0].startswith("mode 1: fp8 rollout, BF16 train")
    warn = next(i for i, x in enumerate(lines) if "the BF16 baseline's held-out accuracy fell 0.45 -> 0.26" in x)
    assert warn <= 2 and lines[-1].startswith("Rule:")  # in the first lines, before the rule


def test_a_baseline_that_holds_or_falls_within_the_seed_spread_passes(tmp_path):
    assert verdict(study(tmp_path / "up", [0.50, 0.56]))[0] == 0
    within = [0.36, 0.50]  # mean 0.43 < 0.45, but the spread of the last eval is 0.099
    assert 0.45 - np.std(within, ddof=1) < np.mean(within) < 0.45
    summary = study(tmp_path / "within", within)
    assert verdict(summary)[0] == 0
    assert not any("baseline's held-out accuracy fell" in x for x in answer(summary))


def test_one_seed_has_no_spread_and_says_so(tmp_path):
    code, line = verdict(study(tmp_path, [0.44]))
    assert code == 1 and "no seed spread (1 seed)" in line


def test_the_command_line_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(study(tmp_path / "a", [0.5, 0.52])))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(study(tmp_path / "b", [0.2, 0.21])))
    assert main([str(good)]) == 0 and ": held" in capsys.readouterr().out
    assert main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("quantroll.compare.heldout_check: error: BF16 held-out accuracy") and err.count("\n") == 1
    assert main([str(tmp_path / "missing.json")]) == 2 and "cannot read it" in capsys.readouterr().err
    no_base = tmp_path / "nobase.json"
    no_base.write_text(json.dumps({"groups": [], "baseline": None}))
    assert main([str(no_base)]) == 2 and "no BF16 baseline" in capsys.readouterr().err


def test_ci_runs_the_check_on_the_main_commands_summary_after_it():
    text = (REPO / ".ci" / "run").read_text()
    main_at = text.index('bash -c "$main_cmd"')
    check_at = text.index("python -m quantroll.compare.heldout_check quantroll-compare/summary.json")
    assert main_at < check_at and text.rstrip().endswith("$check")
    # the module runs as CI calls it (python -m), from a clean interpreter
    done = subprocess.run([sys.executable, "-m", "quantroll.compare.heldout_check"], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 2 and "usage" in done.stderr

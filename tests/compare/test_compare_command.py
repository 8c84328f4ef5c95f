"""`quantroll compare` end to end on the built-in model (CPU, a few steps per run):
the runs are ordinary train runs, the report's numbers are the runs' JSONL numbers,
a rerun continues instead of redoing, and a failing run is listed while others finish."""

import json

import pytest

from quantroll.cli import main
from quantroll.commands.compare import train_config
from quantroll.commands.compare_flags import RECIPE, recipe
from quantroll.compare import runner
from quantroll.rl.config import TrainConfig

SMALL = ["--num-rollout", "2", "--seeds", "1", "--modes", "1", "--train-args",
         "--rollout-batch-size 4 --n-samples-per-prompt 2 --eval-size 8"]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "study"
    assert main(["compare", "--output-dir", str(out), *SMALL]) == 0
    return out


@pytest.mark.slow
def test_compare_writes_runs_summary_and_report(study):
    runs = sorted(p.name for p in (study / "runs").iterdir())
    assert runs == ["bf16-baseline-none-seed1", "fp8-rollout-none-seed1", "fp8-rollout-tis-seed1"]
    for name in ("summary.json", "report.md", "report.html"):
        assert (study / name).is_file()
    summary = json.loads((study / "summary.json").read_text())
    for run in runs:
        spec = json.loads((study / "runs" / run / "run.json").read_text())
        assert spec["status"] == "done" and spec["command"][:2] == ["quantroll", "train"]
        # the child ran on config.json: the configuration train makes of the command run.json shows
        config = TrainConfig.from_json((study / "runs" / run / "config.json").read_text(), "config.json")
        assert config == train_config(spec["command"][1:])
        # the saved config names its metrics file absolutely: a rerun from another directory finds it
        assert config.output.metrics_file == str((study / "runs" / run / "metrics.jsonl").absolute())
        assert config.optimizer.lr == float(RECIPE["--lr"])  # compare's recipe, --train-args left lr alone
        assert config.rollout.train_problems == int(RECIPE["--train-problems"])
        assert config.rollout.rollout_batch_size == 4 and config.correction.enabled == run.endswith("tis-seed1")
        lines = _lines(study / "runs" / run / "metrics.jsonl")
        assert [r["step"] for r in lines] == [0, 1]
        row = next(r for r in summary["runs"] if r["run_id"] == run)
        assert row["gap_step0"] == pytest.approx(
            lines[0]["train_rollout_logprob_abs_diff"], rel=1e-12)
        assert "eval_engine_accuracy" in lines[-1] and "eval_trainer_accuracy" in lines[-1]
    bf16 = _lines(study / "runs" / runs[0] / "metrics.jsonl")[0]
    fp8 = _lines(study / "runs" / runs[1] / "metrics.jsonl")[0]
    # same prompts (same seed): the same number of samples and the same rewards' basis; the gap is the precision's
    assert bf16["mismatch_seqs"] == fp8["mismatch_seqs"]
    assert bf16["train_rollout_logprob_abs_diff"] < 1e-5 < 1e-3 < fp8["train_rollout_logprob_abs_diff"]
    assert "emulated" in fp8["rollout_precision"]
    report = (study / "report.md").read_text()
    assert "mode 1: fp8 rollout, BF16 train (emulated)" in report


@pytest.mark.slow
def test_rerun_keeps_finished_runs_and_redoes_an_interrupted_one(study, capsys):
    interrupted = study / "runs" / "fp8-rollout-tis-seed1"
    spec = json.loads((interrupted / "run.json").read_text())
    (interrupted / "run.json").write_text(json.dumps({**spec, "status": "running"}))
    kept = study / "runs" / "bf16-baseline-none-seed1" / "metrics.jsonl"
    before = kept.stat().st_mtime_ns
    assert main(["compare", "--output-dir", str(study), *SMALL]) == 0
    out = capsys.readouterr().out
    assert out.count("done earlier, kept") == 2
    assert kept.stat().st_mtime_ns == before
    assert json.loads((interrupted / "run.json").read_text())["status"] == "done"


@pytest.mark.slow
def test_a_failing_run_is_listed_with_its_error_and_the_others_complete(tmp_path, monkeypatch):
    real = runner.command_for

    def broken_for_tis(setup, spec, checkpoints, run_dir):  # parses, then fails when the run starts
        cmd = real(setup, spec, checkpoints, run_dir)
        return cmd + ["--prompt-data", "no-such-prompts.jsonl"] if spec.correction == "tis" else cmd

    monkeypatch.setattr(runner, "command_for", broken_for_tis)
    out = tmp_path / "study"
    assert main(["compare", "--output-dir", str(out), *SMALL]) == 1  # report written, failure signalled
    summary = json.loads((out / "summary.json").read_text())
    status = {r["run_id"]: r["status"] for r in summary["runs"]}
    assert status == {"bf16-baseline-none-seed1": "done", "fp8-rollout-none-seed1": "done",
                      "fp8-rollout-tis-seed1": "failed"}
    failed = next(r for r in summary["runs"] if r["status"] == "failed")
    assert "no-such-prompts.jsonl" in failed["error"]
    assert "no-such-prompts.jsonl" in (out / "report.md").read_text()


def test_train_args_may_not_override_what_compare_sets(tmp_path, capsys):
    assert main(["compare", "--output-dir", str(tmp_path), "--train-args", "--seed 3"]) == 2
    assert "--seed" in capsys.readouterr().err


def test_a_compare_directory_of_an_older_quantroll_is_named_and_left_alone(tmp_path, capsys):
    """Runs and a summary without quantroll's marker (written before markers existed) are
    refused as such, in one line, and nothing in the directory changes; a directory with
    only unrelated files gets the general refusal."""
    old = tmp_path / "old"
    (old / "runs" / "bf16-none-s1").mkdir(parents=True)
    (old / "runs" / "bf16-none-s1" / "metrics.jsonl").write_text('{"step": 0}\n')
    (old / "summary.json").write_text("{}")
    before = sorted(p.relative_to(old).as_posix() for p in old.rglob("*"))
    assert main(["compare", "--output-dir", str(old), "--num-rollout", "1"]) == 2
    err = capsys.readouterr().err
    assert "looks like the output of an older quantroll" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.relative_to(old).as_posix() for p in old.rglob("*")) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["compare", "--output-dir", str(other), "--num-rollout", "1"]) == 2
    assert "holds files quantroll did not write (notes.txt)" in capsys.readouterr().err


def test_a_quantized_source_is_refused(tmp_path, capsys, tiny_checkpoint):
    from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint

    fp8 = tmp_path / "fp8"
    convert_checkpoint(tiny_checkpoint(), fp8, ConvertConfig(format="fp8", progress=False))
    assert main(["compare", "--output-dir", str(tmp_path / "o"), "--hf-checkpoint", str(fp8)]) == 2
    assert "quantized" in capsys.readouterr().err


@pytest.mark.slow
def test_response_length_sweep_runs_sample_to_full_length_and_are_reported(tmp_path):
    out = tmp_path / "study"
    argv = ["compare", "--output-dir", str(out), "--num-rollout", "1", "--seeds", "1", "--modes", "1",
            "--corrections", "none", "--sweep-response-len", "12,20", "--train-args", "--rollout-batch-size 2 --n-samples-per-prompt 2 --eval-size 4"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {(r["precision"], r["response_len"]): r for r in summary["sweep"]}
    assert set(rows) == {("bf16", 12), ("bf16", 20), ("fp8", 12), ("fp8", 20)}
    for (precision, length), row in rows.items():
        mode = "baseline" if precision == "bf16" else "rollout"
        lines = _lines(out / "runs" / f"{precision}-{mode}-none-seed1-len{length}" / "metrics.jsonl")
        assert lines[0]["response_len_mean"] == length  # EOS ignored: every response is full length
        assert row["gap_step0"]["train_rollout_logprob_abs_diff"]["mean"] == pytest.approx(
            lines[0]["train_rollout_logprob_abs_diff"], rel=1e-12)
    assert (out / "plots" / "gap_vs_response_len.png").is_file()


@pytest.mark.slow
def test_ctrl_c_keeps_finished_runs_and_exits_130(tmp_path, monkeypatch, capsys):
    real, calls = runner.run_one, []

    def interrupt_the_second(setup, spec, checkpoints, config_of, log=print, **placed):
        calls.append(spec.run_id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(setup, spec, checkpoints, config_of, log, **placed)

    monkeypatch.setattr(runner, "run_one", interrupt_the_second)
    out = tmp_path / "study"
    assert main(["compare", "--output-dir", str(out), *SMALL]) == 130
    err = capsys.readouterr().err
    assert err.startswith("quantroll compare: interrupted: ") and "run the same command again" in err
    assert json.loads((out / "runs" / calls[0] / "run.json").read_text())["status"] == "done"
    assert not (out / "summary.json").exists()


@pytest.mark.slow
def test_changing_the_conversion_redoes_the_low_precision_runs_only(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["compare", "--output-dir", str(out), *SMALL]) == 0
    capsys.readouterr()
    assert main(["compare", "--output-dir", str(out), "--num-layers-at-start-in-bf16", "1", *SMALL]) == 0
    printed = capsys.readouterr().out
    assert "converting" in printed and printed.count("done earlier, kept") == 1  # the bf16 run only
    kept = json.loads((out / "checkpoints" / "fp8" / "config.json").read_text())["quantization_config"]
    assert any(m.startswith("model.layers.0.") for m in kept["modules_to_not_convert"])


def test_the_default_study_covers_modes_1_and_2():
    from quantroll.cli import build_parser
    from quantroll.compare.matrix import build_matrix

    args = build_parser().parse_args(["compare"])
    specs = build_matrix(args.precisions, args.corrections, args.modes, args.seeds, args.rollout_max_response_len,
                         False)
    assert {(s.precision, s.unified) for s in specs} == {("bf16", False), ("fp8", False), ("fp8", True)}
    assert {s.correction for s in specs if s.precision == "fp8"} == {"none", "tis"} and len(specs) == 10


def test_the_recipe_fills_in_what_train_args_leave_out():
    assert recipe(()) == ("--lr", "5e-5", "--train-problems", "2048")
    assert recipe(("--lr", "1e-4")) == ("--train-problems", "2048")  # the user's flag replaces the recipe's
    assert recipe(("--lr=1e-4", "--train-problems", "64")) == ()
    for task in ("--task", "--prompt-data", "--digits", "--count-span"):  # the pool was sized for the built-in task
        assert recipe((task, "x")) == ("--lr", "5e-5")


def test_train_args_help_points_at_train_help(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "every flag and its default: quantroll train --help" in text
    assert "--modes MODES 1 = low-precision rollout" in text and "(default: 1,2)" in text

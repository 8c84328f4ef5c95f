"""`quantroll train` refuses bad settings before any work (found by probing its flags,
2026-12-01): numbers out of range, flags that would be silently ignored, and output paths
it could not write or whose contents it would destroy (--save-hf, --save, --convert-dir
used to replace an existing directory, the user's files with it)."""

import pytest

from quantroll.cli import main
from quantroll.errors import QuantrollError
from quantroll.rl.config import TrainConfig
from quantroll.rl.preflight import check_outputs


@pytest.mark.parametrize("kw,message", [
    ({"rollout_batch_size": 0}, "--rollout-batch-size must be >= 1, got 0"),
    ({"n_samples_per_prompt": 1}, "--n-samples-per-prompt must be >= 2 (grpo groups), got 1"),
    ({"num_rollout": 0}, "--num-rollout must be >= 1"),
    ({"rollout_max_response_len": 0}, "--rollout-max-response-len must be >= 1"),
    ({"global_batch_size": -2}, "--global-batch-size must be >= 1, got -2"),
    ({"lr": -1.0}, "--lr must be a finite number > 0"), ({"lr": float("nan")}, "--lr must be a finite number"),
    ({"eps_clip": -0.5}, "--eps-clip must be a finite number > 0"),
    ({"use_tis": True, "tis_clip": -1.0}, "--tis-clip must be a finite number > 0"),
    ({"use_tis": True, "tis_clip": 0.5, "tis_clip_low": 3.0}, "--tis-clip-low 3.0 must be below --tis-clip 0.5"),
    ({"tis_clip": 3.0}, "--tis-clip/--tis-clip-low are set but --use-tis is not"),
    ({"kl_loss_coef": 0.5}, "--kl-loss-coef is set but --use-kl-loss is not"),
    ({"use_kl_loss": True}, "--use-kl-loss needs a positive --kl-loss-coef"),
    ({"use_kl_loss": True, "kl_loss_coef": -1.0}, "--kl-loss-coef must be a finite number >= 0"),
    ({"eval_size": 0}, "--eval-size must be >= 1"), ({"eval_interval": -1}, "--eval-interval must be >= 0"),
    ({"digits": 0}, "--digits must be >= 1"), ({"seed": -5}, "--seed must be >= 0"),
    ({"kv_cache_memory_gb": float("nan")}, "--kv-cache-memory-gb must be a finite number > 0"),
    ({"save": "x"}, "--save needs --save-interval N"),
])
def test_bad_settings_are_refused_in_one_line(kw, message):
    with pytest.raises(QuantrollError, match=None) as err:
        TrainConfig.of(**kw)
    assert message in str(err.value)


def test_recipes_are_exclusive_on_the_command_line(capsys):
    assert main(["train", "--fp8-recipe", "blockwise", "--fp4-recipe", "nvfp4"]) == 2
    assert "both given" in capsys.readouterr().err


def test_output_paths_are_checked_before_any_work(tmp_path):
    precious = tmp_path / "data"
    precious.mkdir()
    (precious / "precious.txt").write_text("keep me")
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    cases = [
        (TrainConfig.of(save_hf=str(precious)), r"--save-hf .* holds files quantroll did not write \(precious.txt\)"),
        (TrainConfig.of(save_hf=str(precious), force=True), "did not write .* --force or not"),
        (TrainConfig.of(save=str(precious), save_interval=1), r"--save .* did not write \(precious.txt\)"),
        (TrainConfig.of(convert_dir=str(precious), rollout_precision="fp8"), r"--convert-dir .* did not write"),
        (TrainConfig.of(save_hf=str(a_file / "hf")), "afile is a file, not a directory"),
        (TrainConfig.of(metrics_file=str(tmp_path)), "is a directory; give a file path"),
        (TrainConfig.of(tensorboard_dir=str(a_file)), "is a file; give a directory path"),
    ]
    for cfg, message in cases:
        with pytest.raises(QuantrollError, match=message):
            check_outputs(cfg)
    assert (precious / "precious.txt").read_text() == "keep me"
    check_outputs(TrainConfig.of(save_hf=str(tmp_path / "new"), metrics_file=str(tmp_path / "m.jsonl")))  # fine
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "trainer_state.pt").write_bytes(b"")
    check_outputs(TrainConfig.of(save=str(tmp_path / "state"), save_interval=1))  # a previous run's state: resumable


def test_compare_checks_every_runs_command_line_before_any_run(tmp_path, capsys):
    out = tmp_path / "cmp"
    cases = [
        (["--train-args", "--lr -1"], "--lr must be a finite number > 0"),
        (["--train-args", "--bogus 1"], "refuses its command line"),
        (["--train-args", "--lr 'x"], "No closing quotation"),
        (["--sweep-response-len", "0,-4"], "--rollout-max-response-len must be >= 1"),
    ]
    for extra, message in cases:
        assert main(["compare", "--output-dir", str(out), *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra
        assert not out.exists()  # nothing written
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert main(["compare", "--output-dir", str(a_file)]) == 2
    assert "is a file; give a directory path" in capsys.readouterr().err


def test_a_ref_load_of_another_architecture_and_moe_switches_on_a_dense_model_are_refused(tiny_checkpoint, capsys):
    """The engine runs the built-in dense model (4 layers); a --ref-load of 3 layers used to
    train anyway (with a huge gap), routing replay on a dense model was ignored."""
    from quantroll.builtin import builtin_checkpoint

    engine_dir = builtin_checkpoint("dense")
    other = tiny_checkpoint(num_hidden_layers=3)
    assert main(["train", "--hf-checkpoint", str(engine_dir), "--ref-load", str(other), "--num-rollout", "1",
                 "--device", "cpu"]) == 2
    assert "--ref-load's " in capsys.readouterr().err
    assert main(["train", "--use-rollout-routing-replay", "--num-rollout", "1", "--device", "cpu"]) == 2
    assert "need a MoE model; this one is dense" in capsys.readouterr().err


def test_cuda_asked_of_a_machine_without_it_is_one_line(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(["train", "--device", "cuda", "--num-rollout", "1"]) == 2
    assert "this machine has no CUDA device; use --device cpu" in capsys.readouterr().err


def test_inspect_checks_its_json_path_first(tmp_path, capsys):
    assert main(["inspect", str(tmp_path), "--json", str(tmp_path)]) == 2
    assert "is a directory; give a file path" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path), "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err

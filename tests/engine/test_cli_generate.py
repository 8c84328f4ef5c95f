"""`quantroll generate` end to end on a tiny checkpoint with its tokenizer."""

from quantroll.cli import main


def test_generate_prints_samples(tiny_qwen3_dir, capsys):
    rc = main(["generate", "--hf-checkpoint", str(tiny_qwen3_dir), "--prompt", "The quick brown fox",
               "--n", "2", "--max-new-tokens", "5", "--temperature", "0.8", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("--- sample") == 2 and "finish=length" in out and "The quick brown fox" in out


def test_generate_without_tokenizer_is_refused(tiny_checkpoint, capsys):
    bare = tiny_checkpoint(tokenizer=False)
    rc = main(["generate", "--hf-checkpoint", str(bare), "--prompt", "x", "--device", "cpu"])
    assert rc == 2 and "tokenizer.json not found" in capsys.readouterr().err


def test_a_device_the_machine_lacks_is_refused_in_one_line(tiny_qwen3_dir, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    rc = main(["generate", "--hf-checkpoint", str(tiny_qwen3_dir), "--prompt", "x", "--device", "cuda:3"])
    err = capsys.readouterr().err
    assert rc == 2 and "--device cuda:3: this machine has 1 CUDA device(s); pick cuda:0 .. cuda:0" in err
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(["generate", "--hf-checkpoint", str(tiny_qwen3_dir), "--prompt", "x", "--device", "cuda:0"]) == 2
    assert "this machine has no CUDA device" in capsys.readouterr().err
    assert main(["generate", "--hf-checkpoint", str(tiny_qwen3_dir), "--prompt", "x", "--device", "gpu2"]) == 2
    assert "--device gpu2: not a device name" in capsys.readouterr().err


def test_an_indexed_cuda_device_becomes_the_current_one(monkeypatch):
    """Triton launches on the current CUDA device: `--device cuda:N` must make N current."""
    import torch

    from quantroll import cli

    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    cli.use_device("cuda:1")
    cli.use_device("cpu")
    cli.use_device("cuda")  # no index: the current device stays
    assert chosen == [1]


def test_a_missing_checkpoint_and_no_samples_are_refused(tiny_qwen3_dir, tmp_path, capsys):
    assert main(["generate", "--hf-checkpoint", str(tmp_path / "nowhere"), "--prompt", "x", "--device", "cpu"]) == 2
    assert "nowhere: no such directory" in capsys.readouterr().err
    assert main(["generate", "--hf-checkpoint", str(tiny_qwen3_dir), "--prompt", "x", "--n", "0",
                 "--device", "cpu"]) == 2
    assert "--n must be >= 1, got 0" in capsys.readouterr().err
    assert main(["generate", "--hf-checkpoint", str(tiny_qwen3_dir), "--prompt", "x", "--temperature", "nan",
                 "--device", "cpu"]) == 2
    assert "temperature must be a finite number" in capsys.readouterr().err


def test_a_large_n_prints_in_rounds_with_each_samples_own_seed(tiny_qwen3_dir, capsys, monkeypatch):
    """Rounds of SAMPLES_PER_ROUND: 5 samples in rounds of 2 print the same text, sample by
    sample, as in one round (sample i samples with seed + i either way)."""
    from quantroll.commands import generate

    args = ["generate", "--hf-checkpoint", str(tiny_qwen3_dir), "--prompt", "12+7=", "--n", "5",
            "--max-new-tokens", "6", "--seed", "11", "--device", "cpu"]
    assert main(args) == 0
    whole = capsys.readouterr().out
    monkeypatch.setattr(generate, "SAMPLES_PER_ROUND", 2)
    assert main(args) == 0
    rounds = capsys.readouterr().out
    assert rounds == whole and whole.count("--- sample") == 5 and "--- sample 4:" in whole
    assert len({block for block in whole.split("--- sample")[1:]}) > 1  # the samples differ: seeds are per sample

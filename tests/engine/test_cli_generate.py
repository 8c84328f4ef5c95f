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

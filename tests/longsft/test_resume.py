"""A long SFT run killed mid-way and resumed gives the uninterrupted run's losses, quality
checks and weights, bit for bit (CPU, float32); a saved state is never overwritten by
accident and never resumed under other settings."""

import json

import pytest
import torch
from safetensors.torch import load_file

from quantroll.errors import QuantrollError
from quantroll.longsft.run import LongSFTConfig, long_sft
from quantroll.longsft.shapes import parse_shape
from quantroll.tasks.trace import FibTraceTask

SHAPE = parse_shape("tiny,num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=2,head_dim=32",
                    256)
TASK = FibTraceTask(length=60, digits=2)
CFG = LongSFTConfig(steps=6, tokens_per_batch=300, micro_batch_tokens=120, lr=3e-3, warmup=2, save_every=2,
                    check_every=3, val_size=3, eval_size=3, target_pass_rate=None)


class Killed(Exception):
    pass


def _kill_at(step):
    def on_step(s, loss):
        if s == step:
            raise Killed
    return on_step


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    whole = long_sft(tmp_path / "whole", TASK, SHAPE, CFG, tmp_path / "state-whole", log=lambda s: None)
    with pytest.raises(Killed):  # killed after step 4 (0-based) ran: the last state saved is step 3's
        long_sft(tmp_path / "cut", TASK, SHAPE, CFG, tmp_path / "state-cut", log=lambda s: None, on_step=_kill_at(4))
    assert not (tmp_path / "cut").exists()
    saved = json.loads((tmp_path / "state-cut/state/record.json").read_text())
    assert saved["step"] == 3 and len(saved["losses"]) == 4 and [c["step"] for c in saved["checks"]] == [3]
    resumed = long_sft(tmp_path / "cut", TASK, SHAPE, CFG, tmp_path / "state-cut", resume=True, log=lambda s: None)
    assert resumed["resumed_at"] == 4 and whole["resumed_at"] is None
    assert resumed["losses"] == whole["losses"]  # bit for bit: step 4 ran again from step 3's state
    assert len(whole["losses"]) == 6 and whole["losses"][-1] < whole["losses"][0]
    assert resumed["checks"] == whole["checks"] and resumed["greedy_after"] == whole["greedy_after"]
    assert resumed["greedy_before"] == whole["greedy_before"] is not None
    a, b = load_file(str(tmp_path / "whole/model.safetensors")), load_file(str(tmp_path / "cut/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    check = whole["checks"][0]
    assert check["step"] == 3 and set(check["by_len"]) == set(check["sampled"]["by_len"])
    assert 0 < check["nll"] < 10 and 0 <= check["sampled"]["pass_rate"] <= 1


def test_a_saved_state_is_neither_overwritten_nor_resumed_under_other_settings(tmp_path):
    cfg = LongSFTConfig(steps=2, tokens_per_batch=300, micro_batch_tokens=120, save_every=1, check_every=0,
                        val_size=2, eval_size=2)
    with pytest.raises(QuantrollError, match="no saved SFT state"):
        long_sft(tmp_path / "o", TASK, SHAPE, cfg, tmp_path / "s", resume=True, log=lambda s: None)
    with pytest.raises(Killed):
        long_sft(tmp_path / "o", TASK, SHAPE, cfg, tmp_path / "s", log=lambda s: None, on_step=_kill_at(0))
    with pytest.raises(QuantrollError, match="pass --resume"):
        long_sft(tmp_path / "o", TASK, SHAPE, cfg, tmp_path / "s", log=lambda s: None)
    with pytest.raises(QuantrollError, match=r"other settings \(lr\)"):
        long_sft(tmp_path / "o", TASK, SHAPE, LongSFTConfig(**{**cfg.__dict__, "lr": 1e-3}), tmp_path / "s",
                 resume=True, log=lambda s: None)


@pytest.mark.parametrize("argv, words", [
    (["--task", "fib", "--tokens-per-batch", "400"], "needs --state-dir"),
    (["--task", "fib", "--shape", "long"], "add --tokens-per-batch"),
    (["--task", "fib", "--resume"], "add --tokens-per-batch"),
    (["--task", "fib", "--tokens-per-batch", "400", "--state-dir", "S", "--moe"], "use --shape tiny-moe"),
    (["--task", "fib", "--tokens-per-batch", "400", "--state-dir", "S", "--shape", "tiny,x=1"], "not field=value"),
    (["--task", "fib", "--trace-len", "5000", "--tokens-per-batch", "400", "--state-dir", "S"], "raise --context"),
])
def test_the_long_flags_are_checked_before_anything_is_written(tmp_path, capsys, argv, words):
    from quantroll.cli import main

    assert main(["sft", "--save", str(tmp_path / "out"), *argv]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not any(tmp_path.iterdir())

"""``sft --time-limit``: a long SFT run split over calls of limited length (bench/long_study.sh)
stops after the step that passes its deadline with its state saved and nothing exported,
and the resumed run ends where an uninterrupted one does, bit for bit (CPU, float32)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from quantroll.longsft.run import LongSFTConfig, long_sft
from quantroll.longsft.shapes import parse_shape
from quantroll.tasks.trace import FibTraceTask

SHAPE = parse_shape("tiny,num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=2,head_dim=32",
                    256)
TASK = FibTraceTask(length=60, digits=2)
CFG = LongSFTConfig(steps=4, tokens_per_batch=300, micro_batch_tokens=120, lr=3e-3, warmup=1, save_every=3,
                    check_every=0, val_size=2, eval_size=2, target_pass_rate=None)
QUIET = {"log": lambda s: None}


def test_a_run_past_its_deadline_stops_saved_and_resumes_to_the_uninterrupted_result(tmp_path):
    whole = long_sft(tmp_path / "whole", TASK, SHAPE, CFG, tmp_path / "s-whole", **QUIET)
    # a deadline already passed: each call runs one step (save_every 3 does not fall on it: saved anyway)
    first = long_sft(tmp_path / "cut", TASK, SHAPE, CFG, tmp_path / "s-cut", deadline=0.0, **QUIET)
    assert first == {"stopped_by": "time_limit", "last_step": 0, "steps_run": 1, "resumed_at": None}
    assert not (tmp_path / "cut").exists()
    assert json.loads((tmp_path / "s-cut/state/record.json").read_text())["step"] == 0
    second = long_sft(tmp_path / "cut", TASK, SHAPE, CFG, tmp_path / "s-cut", resume=True, deadline=0.0, **QUIET)
    assert second["stopped_by"] == "time_limit" and second["last_step"] == 1 and second["resumed_at"] == 1
    last = long_sft(tmp_path / "cut", TASK, SHAPE, CFG, tmp_path / "s-cut", resume=True, **QUIET)
    assert last["stopped_by"] == "steps" and last["resumed_at"] == 2
    assert last["losses"] == whole["losses"] and len(whole["losses"]) == 4
    a, b = load_file(str(tmp_path / "whole/model.safetensors")), load_file(str(tmp_path / "cut/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_deadline_at_the_last_step_still_exports(tmp_path):
    cfg = LongSFTConfig(**{**CFG.__dict__, "steps": 1})
    stats = long_sft(tmp_path / "o", TASK, SHAPE, cfg, tmp_path / "s", deadline=0.0, **QUIET)
    assert stats["stopped_by"] == "steps" and (tmp_path / "o/model.safetensors").is_file()


def test_the_command_exits_3_at_its_time_limit_and_resumes(tmp_path, capsys):
    from quantroll.cli import main

    argv = ["sft", "--save", str(tmp_path / "out"), "--task", "fib", "--trace-len", "40,60", "--tokens-per-batch", "300",
            "--micro-batch-tokens", "120", "--shape", "tiny,num_hidden_layers=1,hidden_size=64,intermediate_size=128",
            "--context", "256", "--state-dir", str(tmp_path / "s"), "--steps", "2", "--check-every", "0",
            "--eval-size", "2", "--val-size", "2", "--device", "cpu"]
    assert main([*argv, "--time-limit", "0"]) == 3
    out = capsys.readouterr().out
    assert "stopped at --time-limit after 1 of 2 steps" in out and not (tmp_path / "out").exists()
    assert main([*argv, "--resume"]) == 0
    stats = json.loads((tmp_path / "out/quantroll_sft.json").read_text())
    assert stats["resumed_at"] == 1 and len(stats["losses"]) == 2
    assert stats["task"] == {"name": "fib", "lengths": [40, 60], "terms": 2, "digits": 4, "spread": 0.2,
                             "partial_credit": False}


@pytest.mark.parametrize("argv, words", [
    (["--tokens-per-batch", "400", "--state-dir", "S", "--time-limit", "-1"], "--time-limit must be >= 0"),
    (["--time-limit", "5"], "add --tokens-per-batch"),
    (["--trace-len", "40,x"], "comma-separated lengths"),
    (["--trace-len", "40,40", "--tokens-per-batch", "400", "--state-dir", "S"], "a length is given twice"),
])
def test_bad_flags_are_one_line_errors(tmp_path, capsys, argv, words):
    from quantroll.cli import main

    assert main(["sft", "--save", str(tmp_path / "out"), "--task", "fib", *argv]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "S").exists()

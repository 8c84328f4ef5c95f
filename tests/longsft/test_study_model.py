"""The committed long-study model (quantroll/data/fib-qwen3-long, issue 42): what its recipe file
says it is, within the issue's size limits, and trained: teacher-forced per-token NLL on held-out
fib traces near the task's operand-order entropy (~0.036 nats a token), where a random model of
the same shape sits near ln(vocab) (~4)."""

import hashlib
import math
import json
from pathlib import Path

import pytest
import torch

from quantroll.longsft.quality import nll_by_length
from quantroll.sft import held_out_problems
from quantroll.tasks.trace import FibTraceTask
from quantroll.trainer.policy import load_policy

MODEL = Path(__file__).resolve().parents[2] / "quantroll/data/fib-qwen3-long"


def recipe_hashes() -> dict[str, str]:
    lines = (MODEL / "sft-model.txt").read_text().splitlines()
    return {line.split()[2]: line.split()[1] for line in lines if line.startswith("sha256:")}


def test_the_files_are_the_ones_the_recipe_names():
    hashes = recipe_hashes()
    assert set(hashes) == set(json.loads((MODEL / ".quantroll").read_text())["files"])
    for name, digest in hashes.items():
        assert hashlib.sha256((MODEL / name).read_bytes()).hexdigest() == digest, name
    recipe = (MODEL / "sft-model.txt").read_text()
    assert "quantroll sft" in recipe and "--task fib" in recipe and "seed: 0" in recipe


def test_it_is_within_the_issues_size_limits():
    from safetensors import safe_open

    with safe_open(str(MODEL / "model.safetensors"), "pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert params <= 8_000_000 and dtypes == {"BF16"}
    assert (MODEL / "model.safetensors").stat().st_size <= 16 * 2**20


@pytest.mark.parametrize("length", [4096])
def test_it_is_trained_on_the_fib_traces(length):
    task = FibTraceTask(length=length, terms=2)
    problems = held_out_problems(task, 2, seed=7)
    torch.manual_seed(0)
    policy = load_policy(MODEL, device="cpu", dtype=torch.float32)
    got = nll_by_length(policy, problems, micro_tokens=6144)
    # SFT measured 0.036 on its validation mix (quantroll_sft.json); 0.1 leaves room for two problems' spread
    assert got["nll"] < 0.1, got

"""`quantroll compare --hf-checkpoint` and `quantroll attribute --hf-checkpoint` end to end
on CPU on a tiny random checkpoint of each family without QK-norm (Llama 3.x with its
llama3 rope, Qwen2.5 with q/k/v biases), quantroll's character tokenizer: every run of the
smallest study finishes, the BF16 baseline's trainer and engine agree, FP8 rollout opens a
gap, and attribution measures that model's cells."""

import dataclasses
import json

import pytest

from quantroll.bench.shapes import shape_config
from quantroll.cli import main
from quantroll.model.random_checkpoint import write_random_checkpoint

pytestmark = pytest.mark.slow

FAMILIES = {"llama": "llama3.2-1b", "qwen2": "qwen2.5-1.5b"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def checkpoint(request, tmp_path_factory):
    cfg = dataclasses.replace(shape_config(FAMILIES[request.param], 1), vocab_size=128, hidden_size=128,
                              intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    return write_random_checkpoint(cfg, tmp_path_factory.mktemp(request.param) / "ckpt", seed=0)


def test_compare_runs_end_to_end(checkpoint, tmp_path):
    out = tmp_path / "study"
    assert main(["compare", "--hf-checkpoint", str(checkpoint), "--output-dir", str(out), "--num-rollout", "1",
                 "--seeds", "1", "--corrections", "none", "--modes", "1", "--eval-interval", "0", "--train-args",
                 "--rollout-batch-size 2 --n-samples-per-prompt 2 --eval-size 4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    gaps = {row["run_id"]: row["gap_step0"] for row in summary["runs"]}
    assert set(gaps) == {"bf16-baseline-none-seed1", "fp8-rollout-none-seed1"}
    assert gaps["bf16-baseline-none-seed1"] < 1e-5 < 1e-4 < gaps["fp8-rollout-none-seed1"]
    assert (out / "report.md").is_file()


def test_attribute_runs_end_to_end(checkpoint, tmp_path):
    out = tmp_path / "attribution"
    assert main(["attribute", "--hf-checkpoint", str(checkpoint), "--output-dir", str(out), "--prompts", "2",
                 "--samples", "2", "--seeds", "1", "--max-new-tokens", "4",
                 "--cheap-only"]) == 0
    report = json.loads((out / "attribution.json").read_text())
    # q/k/v stay BF16 here (k/v of 64 rows: partial 128-row blocks), o and the MLP are FP8
    assert [0, "o"] in report["cells"] and [0, "down"] in report["cells"]
    assert report["cheap_rank_layers"] == [0] and report["cheap"]["layer_local_error"]["0"] > 0

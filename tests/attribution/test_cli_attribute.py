"""`quantroll attribute` and the BF16-exception flags through the CLI: bad input refused in
one line (exit 2, nothing written), and one flag set round-tripping through convert, train
and compare (each keeps exactly the modules the flags name)."""

import json

import pytest

from quantroll.attribution.flagset import parse
from quantroll.cli import main

FLAGS = "--num-layers-at-end-in-bf16 1 --skip 'model.layers.1.self_attn.[qkv]_proj' '*.mlp.down_proj'"
KEPT_LINEARS = ({f"model.layers.3.{m}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                  "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
                | {f"model.layers.1.self_attn.{m}_proj" for m in "qkv"}
                | {f"model.layers.{i}.mlp.down_proj" for i in range(3)})


def refused(capsys, command, *argv, match):
    rc = main([command, *argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"quantroll {command}: error: "), (rc, err)
    assert match in lines[0], lines[0]


@pytest.mark.parametrize("argv,match", [
    (("--seeds", "1,2", "--verify-seeds", "2,3"), "overlap"),
    (("--target-fraction", "1.5"), "--target-fraction"),
    (("--target-gap", "-1"), "--target-gap"),
    (("--prompts", "0"), "--prompts"),
    (("--seeds", "a"), "--seeds"),
    (("--target-gap", "0.1", "--target-fraction", "0.3"), "not allowed with"),
])
def test_attribute_refuses_bad_flags(capsys, tmp_path, argv, match):
    out = tmp_path / "out"
    refused(capsys, "attribute", "--output-dir", str(out), *argv, match=match)
    assert not out.exists()


def test_attribute_refuses_an_existing_output_dir(capsys, tmp_path):
    from quantroll.outputs import write_marker

    out = tmp_path / "out"
    out.mkdir()
    (out / "report.txt").write_text("an earlier attribution")
    write_marker(out)  # one quantroll wrote: replaced only with --force
    refused(capsys, "attribute", "--output-dir", str(out), match="pass --force to replace it")
    (out / "mine.txt").write_text("the user's")  # now it holds a file of the user's: refused, --force or not
    refused(capsys, "attribute", "--output-dir", str(out), "--force", match="did not write (mine.txt)")
    assert sorted(p.name for p in out.iterdir()) == [".quantroll", "mine.txt", "report.txt"]


def test_compare_refuses_a_bad_exception_flag_set(capsys, tmp_path):
    refused(capsys, "compare", "--output-dir", str(tmp_path / "c"), "--bf16-exceptions", "--lr 3", match="--lr")
    assert not (tmp_path / "c").exists()


def test_train_skip_needs_a_low_precision_rollout(capsys, tmp_path):
    refused(capsys, "train", "--skip", "model.layers.0.*", "--num-rollout", "1", match="--skip")


def _kept_linears(checkpoint) -> set[str]:
    qc = json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    return {m for m in qc["modules_to_not_convert"] if m.rsplit(".", 1)[-1].endswith("_proj")}


def test_flag_set_round_trips_through_convert_train_and_compare(capsys, tmp_path):
    from quantroll.builtin import builtin_checkpoint

    args = parse(FLAGS).args()
    assert main(["convert", "--model-dir", str(builtin_checkpoint("dense")), "--save-dir", str(tmp_path / "conv"),
                 "--format", "fp8", *args]) == 0
    assert _kept_linears(tmp_path / "conv") == KEPT_LINEARS
    small = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "2"]
    assert main(["train", "--rollout-precision", "fp8", "--convert-dir", str(tmp_path / "train-conv"),
                 "--num-rollout", "1", *small, *args]) == 0
    assert _kept_linears(tmp_path / "train-conv") == KEPT_LINEARS
    out = tmp_path / "cmp"
    assert main(["compare", "--output-dir", str(out), "--precisions", "fp8", "--corrections", "none", "--seeds", "1",
                 "--num-rollout", "1", "--eval-interval", "0", "--rollout-max-response-len", "2",
                 "--bf16-exceptions", FLAGS, "--train-args", "--rollout-batch-size 2 --n-samples-per-prompt 2"]) == 0
    capsys.readouterr()
    assert _kept_linears(out / "checkpoints" / "fp8-bf16x") == KEPT_LINEARS
    assert _kept_linears(out / "checkpoints" / "fp8") == set()
    summary = json.loads((out / "summary.json").read_text())
    labels = {g["label"] for g in summary["groups"]}
    assert "mode 1: fp8 rollout with BF16 exceptions, BF16 train (emulated)" in labels
    # compare's own --skip applies to every low-precision checkpoint
    out2 = tmp_path / "cmp2"
    assert main(["compare", "--output-dir", str(out2), "--precisions", "fp8", "--corrections", "none", "--seeds", "1",
                 "--num-rollout", "1", "--eval-interval", "0", "--rollout-max-response-len", "2",
                 *parse("--skip '*.mlp.down_proj'").args(),
                 "--train-args", "--rollout-batch-size 2 --n-samples-per-prompt 2"]) == 0
    assert _kept_linears(out2 / "checkpoints" / "fp8") == {f"model.layers.{i}.mlp.down_proj" for i in range(4)}


def test_a_target_no_exception_set_reaches_keeps_the_measurements(capsys, tmp_path):
    """A target only 'every linear in BF16' meets: the measurements are written, the report
    says there is no proposal, and the exit status is 1 with one line saying why (it was a
    refusal that threw the ablations away)."""
    out = tmp_path / "o"
    rc = main(["attribute", "--output-dir", str(out), "--target-gap", "1e-30", "--prompts", "2", "--samples", "1",
               "--seeds", "1", "--verify-seeds", "2", "--max-new-tokens", "3"])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and "short of keeping every linear in BF16" in lines[0], err
    report = (out / "report.md").read_text()
    assert "## Proposal: BF16 exceptions" in report and "None: no BF16 exceptions short of" in report
    result = json.loads((out / "attribution.json").read_text())
    assert result["proposal"]["unreachable"] and "verification" not in result
    assert result["gap_full"] and result["cheap_rank_layers"]  # the measurements themselves


def test_compare_auto_exceptions_refuse_an_unreachable_proposal(tmp_path, monkeypatch):
    """compare --bf16-exceptions auto cannot run with 'every linear BF16': one line naming the
    precision and the measurements' report (the attribution itself is a stand-in here)."""
    import argparse
    import types

    import quantroll.attribution.run as attribution_run
    from quantroll.commands.bf16_exceptions import auto_exceptions
    from quantroll.errors import QuantrollError

    def stand_in(cfg):
        return {"proposal": {"unreachable": "no BF16 exceptions short of keeping every linear in BF16 bring the gap "
                                            "under 1e-30 (--target-fraction 0.5 of the full gap)"},
                "gap_full": {"mean": 0.1}}

    monkeypatch.setattr(attribution_run, "run_attribution", stand_in)
    monkeypatch.setattr("quantroll.attribution.report.write_outputs", lambda result, where: None)
    monkeypatch.setattr("quantroll.commands.bf16_exceptions.low_precisions", lambda specs: ["fp8"])
    setup = types.SimpleNamespace(out_dir=tmp_path, source=tmp_path / "src")
    args = argparse.Namespace(hf_checkpoint=None, builtin_model="dense", device="cpu", compute_dtype="auto")
    with pytest.raises(QuantrollError, match=r"--bf16-exceptions auto for fp8: no BF16 exceptions short of .*report\.md"):
        auto_exceptions(setup, [], args)

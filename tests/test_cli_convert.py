"""`quantroll convert` through cli.main: flags, output, and every bad input (exit 2, one line, no output)."""

import json
import shutil

import pytest
import torch

from quantroll.cli import build_parser, main
from tests.conftest import copy_editing_tensors


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_refused(capsys, tmp_path, dst, *argv, match: str):
    """Exit 2, one stderr line naming the problem, and nothing left at or beside DST."""
    before = sorted(p.name for p in dst.parent.iterdir()) if dst.parent.exists() else None
    rc, out, err = run(capsys, "convert", *argv)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantroll convert: error: "), err
    assert match in lines[0], lines[0]
    assert not dst.exists() or before is not None and dst.name in before
    after = sorted(p.name for p in dst.parent.iterdir()) if dst.parent.exists() else None
    assert after == before, "a partial or temporary directory was left behind"
    return lines[0]


def test_every_flag_documents_its_default():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    parser = sub.choices["convert"]
    for action in parser._actions:
        if action.dest == "help":
            continue
        text = action.help.lower()
        assert "default" in text or "required" in text, action.option_strings


def test_convert_happy_path(capsys, tmp_path, tiny_qwen3_moe_sharded_dir):
    dst = tmp_path / "out" / "fp8"
    rc, out, err = run(
        capsys, "convert", "--model-dir", str(tiny_qwen3_moe_sharded_dir), "--save-dir", str(dst), "--format", "fp8",
        "--skip", "model.layers.2.*", "--num-layers-at-start-in-bf16", "0",
    )  # fmt: skip
    assert rc == 0, err
    assert out.startswith(f"wrote {dst} (fp8): ") and "skip-pattern" in out and "router" in out
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "fp8" and "model.layers.2.self_attn.q_proj" in qc["modules_to_not_convert"]
    assert (dst / "model.safetensors.index.json").exists()


def test_force_replaces_only_a_conversion_quantroll_wrote(capsys, tmp_path, tiny_qwen3_dir):
    dst = tmp_path / "o"
    convert = ("convert", "--model-dir", str(tiny_qwen3_dir), "--save-dir", str(dst))
    rc, _, err = run(capsys, *convert, "--format", "fp8")
    assert rc == 0, err
    listed = json.loads((dst / ".quantroll").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in dst.iterdir() if p.name != ".quantroll")
    rc, _, err = run(capsys, *convert, "--format", "nvfp4")  # without --force: refused, one line
    assert rc == 2 and "already holds an output quantroll wrote; pass --force" in err, err
    rc, _, err = run(capsys, *convert, "--format", "nvfp4", "--force")
    assert rc == 0, err
    assert (dst / "hf_quant_config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    (dst / "notes.txt").write_text("mine")  # now the directory holds a file of the user's
    rc, _, err = run(capsys, *convert, "--format", "fp8", "--force")
    assert rc == 2 and "files quantroll did not write (notes.txt)" in err and "--force or not" in err, err
    assert (dst / "notes.txt").read_text() == "mine" and (dst / "hf_quant_config.json").exists()


def test_an_empty_existing_directory_is_used(capsys, tmp_path, tiny_qwen3_dir):
    dst = tmp_path / "o"
    dst.mkdir()
    rc, _, err = run(capsys, "convert", *_args(tiny_qwen3_dir, dst))
    assert rc == 0, err
    assert (dst / "config.json").is_file()


@pytest.mark.parametrize("patterns", [["*"], ["*proj", "model.*"]])
def test_skip_that_leaves_nothing_to_quantize_is_refused(capsys, tmp_path, tiny_qwen3_dir, patterns):
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(tiny_qwen3_dir, dst, "fp8", "--skip", *patterns),
                   match=f"--skip {patterns[0]!r}")
    rc, _, err = run(capsys, "convert", *_args(tiny_qwen3_dir, dst, "fp8", "--skip", "model.layers.0.*"))
    assert rc == 0, err  # one that leaves some weights: written


# ---- bad input ---------------------------------------------------------------------------


def _args(src, dst, fmt="fp8", *extra):
    return ("--model-dir", str(src), "--save-dir", str(dst), "--format", fmt, *extra)


def test_missing_model_dir(capsys, tmp_path):
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(tmp_path / "nope", dst), match="does not exist")


def test_not_a_checkpoint_dir(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(tmp_path / "empty", dst), match="config.json")


def test_dir_without_safetensors(capsys, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text("{}")
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(tmp_path / "src", dst), match="no safetensors")


def test_malformed_index(capsys, tmp_path, tiny_qwen3_sharded_dir):
    src = shutil.copytree(tiny_qwen3_sharded_dir, tmp_path / "src")
    missing = sorted(src.glob("model-*.safetensors"))[-1]
    missing.unlink()
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(src, dst), match=missing.name)


def test_already_quantized_by_config(capsys, tmp_path, tiny_qwen3_dir):
    assert run(capsys, "convert", *_args(tiny_qwen3_dir, tmp_path / "q"))[0] == 0
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(tmp_path / "q", dst, "mxfp8"), match="already quantized")


def test_already_quantized_by_dtype(capsys, tmp_path, tiny_qwen3_dir):
    assert run(capsys, "convert", *_args(tiny_qwen3_dir, tmp_path / "q"))[0] == 0
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    del cfg["quantization_config"]
    (tmp_path / "q" / "config.json").write_text(json.dumps(cfg))
    dst = tmp_path / "o"
    line = assert_refused(capsys, tmp_path, dst, *_args(tmp_path / "q", dst), match="already quantized")
    assert "F8_E4M3" in line or "F32" in line


@pytest.mark.parametrize(
    "fmt,tensor,value",
    [
        ("fp8", "model.layers.3.mlp.down_proj.weight", float("nan")),  # quantized, written late: partial output existed
        ("nvfp4", "model.layers.1.mlp.up_proj.weight", float("inf")),  # NVFP4 scale-group pre-pass
        ("mxfp8", "model.layers.2.post_attention_layernorm.weight", float("-inf")),  # kept tensor
    ],
)
def test_non_finite_weights_named(capsys, tmp_path, tiny_qwen3_dir, fmt, tensor, value):
    def poison(t):
        t[tensor].view(-1)[7] = value

    src = copy_editing_tensors(tiny_qwen3_dir, tmp_path / "src", poison)
    dst = tmp_path / "o"
    line = assert_refused(capsys, tmp_path, dst, *_args(src, dst, fmt), match=f"'{tensor}'")
    assert "NaN/Inf" in line


def test_failure_with_force_keeps_old_destination(capsys, tmp_path, tiny_qwen3_dir):
    src = copy_editing_tensors(tiny_qwen3_dir, tmp_path / "src", lambda t: t["model.layers.3.mlp.up_proj.weight"].fill_(float("nan")))
    dst = tmp_path / "o"
    rc, _, err = run(capsys, "convert", *_args(tiny_qwen3_dir, dst, "fp8"))
    assert rc == 0, err
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    assert_refused(capsys, tmp_path, dst, *_args(src, dst, "fp8", "--force"), match="NaN")
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before


def test_unsupported_dtype(capsys, tmp_path, tiny_qwen3_dir):
    def to_int(t):
        t["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(384, 256, dtype=torch.int32)

    src = copy_editing_tensors(tiny_qwen3_dir, tmp_path / "src", to_int)
    dst = tmp_path / "o"
    line = assert_refused(capsys, tmp_path, dst, *_args(src, dst), match="model.layers.0.mlp.gate_proj.weight")
    assert "I32" in line


def test_unknown_format(capsys, tmp_path, tiny_qwen3_dir):
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(tiny_qwen3_dir, dst, "int4"), match="unknown format 'int4'")


def test_scale_rule_only_for_mxfp8(capsys, tmp_path, tiny_qwen3_dir):
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(tiny_qwen3_dir, dst, "fp8", "--scale-rule", "ocp"), match="mxfp8 only")


def test_negative_layer_count(capsys, tmp_path, tiny_qwen3_dir):
    dst = tmp_path / "o"
    assert_refused(capsys, tmp_path, dst, *_args(tiny_qwen3_dir, dst, "fp8", "--num-layers-at-end-in-bf16", "-1"), match=">= 0")


def test_destination_exists_without_force(capsys, tmp_path, tiny_qwen3_dir):
    dst = tmp_path / "o"
    dst.mkdir()
    (dst / "mine.txt").write_text("precious")
    assert_refused(capsys, tmp_path, dst, *_args(tiny_qwen3_dir, dst), match="--force")
    assert (dst / "mine.txt").read_text() == "precious"


def test_save_dir_overlapping_model_dir(capsys, tmp_path, tiny_qwen3_dir):
    src = shutil.copytree(tiny_qwen3_dir, tmp_path / "src")
    before = sorted(p.name for p in src.iterdir())
    rc, _, err = run(capsys, "convert", *_args(src, src, "fp8", "--force"))
    assert rc == 2 and "overlaps" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in src.iterdir()) == before
    rc, _, err = run(capsys, "convert", *_args(src, src / "inner", "fp8"))
    assert rc == 2 and "overlaps" in err and not (src / "inner").exists()

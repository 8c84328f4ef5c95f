"""`inspect` on a damaged quantized checkpoint: the summary is printed, each unusable
tensor is named as an ERROR, and the exit status is 1, also with --against (a NaN
scale used to drop out of the SQNR minimum and exit 0; an FP8 weight whose scale is
missing used to be listed as "kept by the checkpoint producer")."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.cli import main
from tests.safety.helpers import write_model


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    model = write_model(root / "bf16")
    convert_checkpoint(model, root / "fp8", ConvertConfig(format="fp8", progress=False))
    return model, root / "fp8"


def _damaged(src, dst, edit):
    import shutil

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    name = sorted(n for n in tensors if n.endswith("weight_scale_inv"))[0]
    edit(tensors, name)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst, name[: -len("_scale_inv")]


@pytest.mark.parametrize("against", [False, True])
def test_nan_and_missing_scales_are_errors_naming_the_tensor(ckpts, tmp_path, capsys, against):
    model, fp8 = ckpts
    assert main(["inspect", str(fp8)] + (["--against", str(model)] if against else [])) == 0
    capsys.readouterr()

    def nan(t, name):
        t[name][0, 0] = float("nan")

    def drop(t, name):
        del t[name]

    for edit, what in ((nan, "holds NaN/Inf scales"), (drop, "is stored as F8_E4M3 but its scale tensor is missing")):
        bad, weight = _damaged(fp8, tmp_path / edit.__name__, edit)
        extra = ["--against", str(model)] if against else []
        report = tmp_path / f"{edit.__name__}.json"
        rc = main(["inspect", str(bad), "--json", str(report), *extra])
        out, err = capsys.readouterr()
        assert rc == 1
        assert err.strip().splitlines() == [err.strip()] and f"tensor '{weight}' {what}" in err
        assert f"ERROR: tensor '{weight}' {what}" in out
        assert "kept by the checkpoint producer" not in out
        assert json.loads(report.read_text())["problems"] == [f"tensor '{weight}' {what}"]

"""`quantroll inspect`: summary, kept reasons, bytes, and SQNR checked against an independent float64 decode."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from quantroll.checkpoint import ConvertConfig, convert_checkpoint
from quantroll.cli import main

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, tiny_checkpoint):
    """format -> (bf16 source dir, quantized dir) for the tiny MoE (sharded)."""
    src = tiny_checkpoint(moe=True, sharded=True)
    out = {}
    for fmt in ("fp8", "mxfp8", "nvfp4"):
        dst = tmp_path_factory.mktemp("insp") / fmt
        convert_checkpoint(src, dst, ConvertConfig(fmt, skip=("model.layers.2.self_attn.o_proj",), progress=False))
        out[fmt] = (src, dst)
    return out


def tensors(d):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out |= load_file(f)
    return out


def decode_float64(fmt, t, module):
    """Dequantize straight from the stored bytes in float64, without quantroll.formats."""
    w = t[module + ".weight"]
    n = w.shape[0]
    if fmt == "fp8":
        s = t[module + ".weight_scale_inv"].double()
        s = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[: n, : w.shape[1]]
        return w.double() * s
    if fmt == "mxfp8":
        s = 2.0 ** (t[module + ".weight_scale_inv"].double() - 127)
        return w.double() * s.repeat_interleave(32, 1)[:, : w.shape[1]]
    codes = torch.stack([w & 0xF, w >> 4], dim=-1).reshape(n, -1).long()
    mag = E2M1[codes & 7]
    vals = torch.where((codes & 8) != 0, -mag, mag)
    s = t[module + ".weight_scale"].double().repeat_interleave(16, 1) * t[module + ".weight_scale_2"].double()
    return vals * s


def sqnr64(x, y):
    x = x.double()
    return 10 * math.log10(float((x * x).sum()) / float(((x - y) ** 2).sum()))


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4"])
def test_inspect_sqnr_matches_independent_float64(capsys, tmp_path, quantized, fmt):
    src, dst = quantized[fmt]
    report = tmp_path / "r.json"
    rc = main(["inspect", str(dst), "--against", str(src), "--top", "3", "--json", str(report)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(report.read_text())
    q, ref = tensors(dst), tensors(src)
    modules = data["quantized"]
    assert modules and len(data["sqnr_db"]) == len(modules)
    expect = {m: sqnr64(ref[m + ".weight"], decode_float64(fmt, q, m)) for m in modules}
    for m in modules:
        assert data["sqnr_db"][m] == pytest.approx(expect[m], abs=1e-6), m
    floor = {"fp8": 28, "mxfp8": 28, "nvfp4": 17}[fmt]  # E4M3 ~31 dB, E2M1 ~20 dB on Gaussian weights
    assert min(expect.values()) > floor
    worst = sorted(expect, key=expect.get)[:3]
    assert [w["module"] for w in data["worst"]] == worst
    lines = out.splitlines()
    i = lines.index("worst 3:")
    assert [ln.split()[-1] for ln in lines[i + 1 : i + 4]] == worst
    assert f"format:     {fmt}" in out and "kept tensors: identical to --against" in out
    assert data["kept_mismatch"] == []


def test_inspect_counts_reasons_and_bytes(capsys, quantized):
    src, dst = quantized["fp8"]
    assert main(["inspect", str(dst)]) == 0
    out = capsys.readouterr().out
    all_t = tensors(dst)
    n_q = sum(1 for n in all_t if n.endswith(".weight_scale_inv"))
    n_kept = sum(1 for n in all_t if n.endswith(".weight") and n[: -len(".weight")] + ".weight_scale_inv" not in all_t)
    assert f"modules:    {n_q} quantized, {n_kept} kept in source precision" in out
    assert "skip-pattern" in out and "model.layers.2.self_attn.o_proj" in out
    assert "router" in out and "model.layers.0.mlp.gate" in out
    assert "partial-blocks" in out and "model.layers.1.mlp.gate_proj" in out
    by_dtype = {}
    for t in all_t.values():
        name = {torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32"}[t.dtype]
        by_dtype[name] = by_dtype.get(name, 0) + t.numel() * t.element_size()
    for name, n in by_dtype.items():
        assert any(ln.split()[:2] == [name, f"{n:,d}"] for ln in out.splitlines()), (name, n)
    assert "SQNR" not in out


def test_inspect_mxfp8_shows_rule_and_bf16_dir(capsys, quantized):
    src, dst = quantized["mxfp8"]
    assert main(["inspect", str(dst)]) == 0
    assert "mxfp8 (scale rule ceil)" in capsys.readouterr().out
    assert main(["inspect", str(src)]) == 0
    out = capsys.readouterr().out
    assert "format:     bf16" in out and "0 quantized" in out


def test_inspect_flags_changed_kept_tensors(capsys, quantized, tiny_checkpoint):
    _, dst = quantized["fp8"]
    other = tiny_checkpoint(moe=True, seed=1)
    assert main(["inspect", str(dst), "--against", str(other)]) == 0
    assert "WARNING:" in capsys.readouterr().out


def test_inspect_errors(capsys, tmp_path, quantized, tiny_qwen3_dir):
    _, dst = quantized["fp8"]
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["inspect", str(dst), "--against", str(tiny_qwen3_dir)]) == 2  # the dense model lacks MoE tensors
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no tensor" in err


def test_inspect_json_replaces_only_its_own_report(capsys, tmp_path, quantized):
    """--json: a re-run replaces the report quantroll wrote; a user's file (JSON or not) is
    refused before any work, left byte for byte as it was."""
    src, dst = quantized["fp8"]
    report = tmp_path / "r.json"
    assert main(["inspect", str(dst), "--against", str(src), "--json", str(report)]) == 0
    first = json.loads(report.read_text())
    assert first["written_by"] == "quantroll"
    assert len(first["worst"]) > 1
    assert main(["inspect", str(dst), "--against", str(src), "--top", "1", "--json", str(report)]) == 0  # replaced
    assert len(json.loads(report.read_text())["worst"]) == 1
    for user in ('{"mine": 1}\n', "notes\n"):
        theirs = tmp_path / "theirs.json"
        theirs.write_text(user)
        capsys.readouterr()
        assert main(["inspect", str(dst), "--json", str(theirs)]) == 2
        err = capsys.readouterr().err
        assert "--json" in err and "not a report quantroll wrote" in err and len(err.strip().splitlines()) == 1
        assert theirs.read_text() == user

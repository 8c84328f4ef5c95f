"""CheckpointReader: layout detection, header-only shapes/dtypes, one-line errors."""

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantroll.checkpoint import CheckpointReader
from quantroll.checkpoint.safetensors_header import read_header
from quantroll.errors import QuantrollError


def test_single_file_headers_match_tensors(tiny_qwen3_dir):
    with CheckpointReader(tiny_qwen3_dir) as r:
        assert not r.sharded and r.shards == ["model.safetensors"]
        full = load_file(tiny_qwen3_dir / "model.safetensors")
        assert set(r.tensors) == set(full)
        for name, t in r.iter_tensors():
            info = r.tensors[name]
            assert info.shape == tuple(t.shape) and info.torch_dtype == t.dtype == torch.bfloat16
            assert torch.equal(t, full[name])
        assert r.config["model_type"] == "qwen3"


def test_sharded_reader_follows_index(tiny_qwen3_moe_sharded_dir):
    d = tiny_qwen3_moe_sharded_dir
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    with CheckpointReader(d) as r:
        assert r.sharded and len(r.shards) > 1
        assert {n: i.file.name for n, i in r.tensors.items()} == index
        for shard in r.shards:  # file order within each shard
            offsets = [i.offset for i in r.shard_tensors(shard)]
            assert offsets == sorted(offsets)


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_missing_dir(tmp_path):
    with pytest.raises(QuantrollError) as e:
        CheckpointReader(tmp_path / "nope")
    assert "does not exist" in _one_line(e)


def test_file_instead_of_dir(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(QuantrollError, match="not a directory"):
        CheckpointReader(tmp_path / "f")


def test_dir_without_config(tmp_path):
    save_file({"a": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(QuantrollError) as e:
        CheckpointReader(tmp_path)
    assert "config.json" in _one_line(e)


def test_dir_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(QuantrollError) as e:
        CheckpointReader(tmp_path)
    assert "no safetensors weights" in _one_line(e)


def test_unindexed_other_name(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    save_file({"a": torch.zeros(2)}, tmp_path / "weights.safetensors")
    with pytest.raises(QuantrollError, match="weights.safetensors"):
        CheckpointReader(tmp_path)


def test_bad_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(QuantrollError, match="not valid JSON"):
        CheckpointReader(tmp_path)


def test_index_with_missing_shard(tiny_qwen3_sharded_dir, tmp_path):
    d = shutil.copytree(tiny_qwen3_sharded_dir, tmp_path / "c")
    victim = sorted(d.glob("model-*.safetensors"))[0]
    victim.unlink()
    with pytest.raises(QuantrollError) as e:
        CheckpointReader(d)
    assert victim.name in _one_line(e) and "missing" in str(e.value)


def test_index_names_tensor_its_shard_lacks(tiny_qwen3_sharded_dir, tmp_path):
    d = shutil.copytree(tiny_qwen3_sharded_dir, tmp_path / "c")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.ghost.weight"] = sorted(set(idx["weight_map"].values()))[0]
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(QuantrollError, match="model.ghost.weight"):
        CheckpointReader(d)


def test_index_without_weight_map(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(QuantrollError, match="weight_map"):
        CheckpointReader(tmp_path)


def _raw_safetensors(path, header: dict, data: bytes):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_unsupported_dtype_names_tensor(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    _raw_safetensors(tmp_path / "model.safetensors", {"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(QuantrollError) as e:
        CheckpointReader(tmp_path)
    assert "'w'" in _one_line(e) and "C64" in str(e.value)


def test_truncated_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    _raw_safetensors(tmp_path / "model.safetensors", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    with pytest.raises(QuantrollError, match="truncated"):
        CheckpointReader(tmp_path)


def test_not_a_safetensors_file(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\x05\0\0\0\0\0\0\0hello")
    with pytest.raises(QuantrollError, match="corrupt"):
        read_header(p)

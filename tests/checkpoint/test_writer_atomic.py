"""StreamingSafetensorsWriter output loads with safetensors; atomic_directory leaves nothing on error."""

import json
import os
import shutil
import stat
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from quantroll.checkpoint import PlannedTensor, StreamingSafetensorsWriter, atomic_directory
from quantroll.errors import QuantrollError

TENSORS = {
    "a.weight": torch.randn(5, 7).to(torch.bfloat16),
    "a.weight_scale_inv": torch.rand(1, 1),
    "b.weight": torch.randn(3, 33).clamp(-448, 448).to(torch.float8_e4m3fn),
    "b.scale": torch.randint(0, 255, (3, 2), dtype=torch.uint8),
    "c.global": torch.tensor(0.25),
    "d.ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
    "e.half": torch.randn(1, 2, 3).half(),
}


def _plan(tensors):
    return [PlannedTensor(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]


def test_streamed_file_loads_with_safetensors(tmp_path):
    path = tmp_path / "x.safetensors"
    with StreamingSafetensorsWriter(path, _plan(TENSORS)) as w:
        for n, t in TENSORS.items():
            w.write(n, t)
    back = load_file(path)
    assert set(back) == set(TENSORS)
    for n, t in TENSORS.items():
        assert back[n].dtype == t.dtype and back[n].shape == t.shape
        assert torch.equal(back[n].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), n
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert n % 8 == 0 and json.loads(path.read_bytes()[8 : 8 + n])["__metadata__"] == {"format": "pt"}


def test_non_contiguous_input_is_written_in_logical_order(tmp_path):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    with StreamingSafetensorsWriter(tmp_path / "t.safetensors", [PlannedTensor("t", t.dtype, (4, 3))]) as w:
        w.write("t", t)
    assert torch.equal(load_file(tmp_path / "t.safetensors")["t"], t)


@pytest.mark.parametrize(
    "name,tensor",
    [("wrong", torch.zeros(5, 7, dtype=torch.bfloat16)), ("a.weight", torch.zeros(5, 7)), ("a.weight", torch.zeros(7, 5, dtype=torch.bfloat16))],
)
def test_unplanned_write_is_refused(tmp_path, name, tensor):
    with pytest.raises(ValueError, match="planned"):
        with StreamingSafetensorsWriter(tmp_path / "x.safetensors", _plan(TENSORS)) as w:
            w.write(name, tensor)


def test_closing_early_is_refused(tmp_path):
    w = StreamingSafetensorsWriter(tmp_path / "x.safetensors", _plan(TENSORS))
    w.write("a.weight", TENSORS["a.weight"])
    with pytest.raises(ValueError, match="a.weight_scale_inv"):
        w.close()


def test_atomic_success_and_no_leftovers(tmp_path):
    dst = tmp_path / "deep" / "er" / "out"
    with atomic_directory(dst) as tmp:
        assert tmp.parent == dst.parent and tmp.name.startswith(".out.partial-")
        (tmp / "f").write_text("new")
    assert (dst / "f").read_text() == "new"
    assert sorted(p.name for p in dst.parent.iterdir()) == ["out"]


def _written(dst, *names):
    """A directory quantroll wrote (through atomic_directory, so it carries the marker)."""
    with atomic_directory(dst, force=True) as tmp:
        for name in names:
            (tmp / name).write_text(name)
    return dst


def test_atomic_uses_an_empty_directory_and_refuses_its_own_without_force(tmp_path):
    (tmp_path / "out").mkdir()
    with atomic_directory(tmp_path / "out") as tmp:  # empty: used without --force
        (tmp / "f").write_text("new")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".quantroll", "f"]
    assert json.loads((tmp_path / "out" / ".quantroll").read_text())["files"] == ["f"]
    with pytest.raises(QuantrollError, match="already holds an output quantroll wrote; pass --force"):
        with atomic_directory(tmp_path / "out"):
            pass
    assert (tmp_path / "out" / "f").read_text() == "new"


@pytest.mark.parametrize("force", [False, True])
def test_atomic_never_replaces_a_directory_with_files_it_did_not_write(tmp_path, force):
    dst = _written(tmp_path / "out", "a")
    (dst / "mine.txt").write_text("precious")
    (dst / "sub").mkdir()
    for name in ("x", "y", "z"):
        (dst / "sub" / name).write_text(name)
    with pytest.raises(QuantrollError, match=r"files quantroll did not write \(mine.txt, sub/x, sub/y and 1 more\)"):
        with atomic_directory(dst, force=force):
            raise AssertionError("the block must not run")
    assert (dst / "mine.txt").read_text() == "precious" and (dst / "a").read_text() == "a"


def test_atomic_refuses_a_file_even_with_force(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(QuantrollError, match="not a directory"):
        with atomic_directory(tmp_path / "out", force=True):
            pass


def test_atomic_refuses_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for target in (".", str(tmp_path.parent)):
        with pytest.raises(QuantrollError, match="current directory"):
            with atomic_directory(target, force=True):
                pass
    assert tmp_path.is_dir()


def test_atomic_force_replaces(tmp_path):
    dst = _written(tmp_path / "out", "old")
    with atomic_directory(dst, force=True) as tmp:
        (tmp / "new").write_text("new")
    assert sorted(p.name for p in dst.iterdir()) == [".quantroll", "new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_atomic_files_follow_the_umask(tmp_path, umask):
    """A file a library wrote 0600 (safetensors' save_file) or a copy of a read-only file
    gets what the umask gives a new file; directories what it gives mkdir."""
    from safetensors.torch import save_file

    old = os.umask(umask)
    try:
        src = tmp_path / "ro.txt"
        src.write_text("x")
        src.chmod(0o400)
        with atomic_directory(tmp_path / "out") as tmp:
            save_file({"a": torch.zeros(2)}, str(tmp / "model.safetensors"))
            shutil.copy2(src, tmp / "copied.txt")
            (tmp / "sub").mkdir(mode=0o700)
    finally:
        os.umask(old)
    for name in ("model.safetensors", "copied.txt", ".quantroll"):
        assert stat.S_IMODE(os.stat(tmp_path / "out" / name).st_mode) == 0o666 & ~umask, name
    for d in ("out", "out/sub"):
        assert stat.S_IMODE(os.stat(tmp_path / d).st_mode) == 0o777 & ~umask, d


@pytest.mark.parametrize("force", [False, True])
def test_atomic_error_leaves_nothing_and_keeps_old(tmp_path, force):
    dst = tmp_path / "a" / "out"
    if force:
        _written(dst, "old")
    with pytest.raises(RuntimeError):
        with atomic_directory(dst, force=force) as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("boom")
    if force:
        assert sorted(p.name for p in dst.iterdir()) == [".quantroll", "old"]
        assert sorted(p.name for p in dst.parent.iterdir()) == ["out"]
    else:
        assert not (tmp_path / "a").exists()  # the parent it created is gone too

"""The files of a saved trainer state, below both of its forms (whole: state.py; one file
per rank: state_shards.py): the record and the tensors, written flushed to disk and read
back with every check made before anything is used. Every problem is one line naming
the file (``Damaged``)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict
from pathlib import Path

import torch

from quantroll.checkpoint.safetensors_header import read_header
from quantroll.checkpoint.writer import PlannedTensor, StreamingSafetensorsWriter
from quantroll.errors import QuantrollError
from quantroll.inputs import read_json
from quantroll.rl import savedir

RECORD_FILE = "state.json"
WHOLE, SHARDED = 1, 2  # format versions: every tensor whole in one file; one file per rank


class Damaged(QuantrollError):
    pass


def check(ok: bool, where: Path, what: str) -> None:
    if not ok:
        raise Damaged(f"--load: {where} is damaged ({what}); resume from another save, or start over with --force")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


# -- writing ------------------------------------------------------------------------------
def optimizer_tensors(masters: list[torch.Tensor], inner: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """(name -> tensor, the record of the optimizer's non-tensor state) for the masters and
    AdamW's state_dict, whole or this rank's shards alike."""
    tensors = {f"master.{i}": m.detach() for i, m in enumerate(masters)}
    layout: dict[str, dict] = {}
    for index, entry in inner["state"].items():
        keys, scalars = [], {}
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"adam.{index}.{key}"] = value.detach()
                keys.append(key)
            else:
                scalars[key] = value
        layout[str(index)] = {"tensors": keys, "scalars": scalars}
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in inner["param_groups"]]
    return tensors, {"param_groups": groups, "state": layout}


def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """One safetensors file, flushed to disk; returns its checksum."""
    planned = [PlannedTensor(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    with StreamingSafetensorsWriter(path, planned, sync=True) as writer:
        for name, t in tensors.items():
            writer.write(name, t)
    return sha256(path)


def write_record(tmp: Path, version: int, step: int, rng: random.Random, optimizer_record: dict, config,
                 **extra) -> None:
    """state.json: the step, both RNG states as integers, the optimizer record, the run's
    config, and what the form adds (its files and their checksums)."""
    state, internal, gauss = rng.getstate()
    record = {
        "format": savedir.FORMAT, "format_version": version, "step": step, **extra,
        "python_rng": [state, list(internal), gauss],
        "torch_rng": torch.get_rng_state().tolist(),
        "optimizer": optimizer_record,
        "config": asdict(config) if config is not None else None,
    }
    with open(tmp / RECORD_FILE, "x") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


# -- reading ------------------------------------------------------------------------------
def read_record(version: Path, step: int) -> dict:
    where = version / RECORD_FILE
    record = read_json(where, "trainer state", fix="resume from another save, or start over with --force")
    check(record.get("format") == savedir.FORMAT and record.get("format_version") in (WHOLE, SHARDED), where,
          f"not a {savedir.FORMAT} record of version {WHOLE} or {SHARDED}")
    check(record.get("step") == step and is_int(record.get("step")), where,
          f"its step is {record.get('step')!r}, the pointer says {step}")
    opt = record.get("optimizer")
    check(isinstance(opt, dict) and isinstance(opt.get("param_groups"), list)
          and isinstance(opt.get("state"), dict), where, "the optimizer record is missing or malformed")
    return record


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def python_rng(value, where: Path) -> tuple:
    check(isinstance(value, list) and len(value) == 3, where, "python_rng is not [version, state, gauss]")
    version, internal, gauss = value
    check(is_int(version) and isinstance(internal, list) and len(internal) == 625
          and all(is_int(x) and 0 <= x < 2**32 for x in internal), where, "python_rng's state is not 625 integers")
    check(gauss is None or isinstance(gauss, float), where, "python_rng's gauss is not a number")
    return version, tuple(internal), gauss


def torch_rng(value, where: Path) -> torch.Tensor:
    size = torch.get_rng_state().numel()
    check(isinstance(value, list) and len(value) == size and all(is_int(x) and 0 <= x < 256 for x in value),
          where, f"torch_rng is not {size} bytes")
    return torch.tensor(value, dtype=torch.uint8)


def read_tensors(path: Path, checksum) -> dict[str, torch.Tensor]:
    """Every tensor of one file, after its header and its checksum were checked."""
    check(isinstance(checksum, str), path, "no checksum of the tensors")
    check(path.is_file(), path, "missing")
    try:
        read_header(path)  # a truncated, random or malformed file
    except QuantrollError as err:
        raise Damaged(f"--load: {path} is damaged ({err}); resume from another save, or start over with --force") \
            from None
    check(sha256(path) == checksum, path, "its bytes changed since the save: checksum mismatch")
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as err:  # the Rust library's own error types
        raise Damaged(f"--load: {path} is damaged ({err}); resume from another save, or start over with --force") \
            from None


def optimizer_state(record: dict, tensors: dict, optimizer, shapes: list[tuple[int, ...]], where: Path) -> dict:
    """The AdamW state_dict the record and tensors describe, checked against ``optimizer``
    (its parameter groups) and ``shapes`` (of each parameter's moments: whole or local)."""
    groups = record["optimizer"]["param_groups"]
    current = optimizer.inner.param_groups
    check(len(groups) == len(current) and all(isinstance(g, dict) for g in groups), where,
          "its optimizer has another number of parameter groups")
    fixed = []
    for saved, now in zip(groups, current):
        check(isinstance(saved.get("params"), list) and len(saved["params"]) == len(now["params"]), where,
              "its optimizer holds another number of parameters")
        check(all(isinstance(v, (int, float, bool, str, list, type(None))) for v in saved.values()), where,
              "an optimizer setting is not a number")
        g = dict(saved)
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        fixed.append(g)
    state = {}
    for index, entry in record["optimizer"]["state"].items():
        check(index.isdigit() and int(index) < len(shapes) and isinstance(entry, dict)
              and isinstance(entry.get("tensors"), list) and isinstance(entry.get("scalars"), dict), where,
              f"optimizer state {index!r} is malformed")
        shape = shapes[int(index)]
        values = dict(entry["scalars"])
        for key in entry["tensors"]:
            name = f"adam.{index}.{key}"
            check(name in tensors, where, f"tensor {name} is missing")
            t = tensors[name]
            check(t.is_floating_point() and (t.dim() == 0 if key == "step" else tuple(t.shape) == shape), where,
                  f"tensor {name} is {t.dtype} {list(t.shape)}, not the moments of a {list(shape)} parameter")
            values[key] = t
        state[int(index)] = values
    return {"state": state, "param_groups": fixed}


def masters(tensors: dict, shapes: list[tuple[int, ...]], where: Path) -> list[torch.Tensor]:
    """The FP32 master weights, checked against ``shapes`` (whole or local)."""
    out = []
    for i, shape in enumerate(shapes):
        t = tensors.get(f"master.{i}")
        check(t is not None, where, f"tensor master.{i} is missing")
        check(t.dtype == torch.float32 and tuple(t.shape) == shape, where,
              f"tensor master.{i} is {t.dtype} {list(t.shape)}, not float32 {list(shape)}")
        out.append(t)
    return out

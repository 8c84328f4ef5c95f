"""Resumable training state: ``--save DIR --save-interval N`` and ``--load DIR``.

A state is data only, never code: the tensors (the policy's BF16 weights, the FP32
master weights, the AdamW moments) in one safetensors file, everything else (the last
finished step, the Python and torch RNG states as integers, the optimizer's settings,
the run's config) in JSON. Nothing is unpickled: a ``trainer_state.pt`` planted or
left by an older quantroll is refused unread, because ``torch.load`` of a pickle runs
whatever the file's author put in it.

Loading checks everything before it changes anything: the JSON's fields and types,
the tensor file's header (a truncated or random file), its checksum (bytes changed
since the save), every tensor's name, dtype and shape against the model and optimizer
being resumed. Each problem is one line naming the file. The directory around a state
(versions, the pointer, atomic replacement) is quantroll/rl/savedir.py.
"""

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

TENSORS_FILE = "state.safetensors"
RECORD_FILE = "state.json"
FORMAT_VERSION = 1


# -- saving -------------------------------------------------------------------------------
def _whole(t: torch.Tensor) -> torch.Tensor:
    """A parameter sharded across ranks (FSDP2's DTensor) gathered whole; others as they are."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _tensors(policy, optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """(name -> tensor, the optimizer's non-tensor state) for one save: whole tensors, also
    from a sharded trainer (then a collective, on every rank)."""
    tensors = {f"model.{k}": _whole(v) for k, v in policy.state_dict().items()}
    masters, inner = optimizer.export()
    tensors.update({f"master.{i}": m.detach() for i, m in enumerate(masters)})
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _write(tmp: Path, tensors: dict, optimizer_record: dict, step: int, rng: random.Random, config) -> None:
    planned = [PlannedTensor(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    with StreamingSafetensorsWriter(tmp / TENSORS_FILE, planned, sync=True) as writer:
        for name, t in tensors.items():
            writer.write(name, t)
    version, internal, gauss = rng.getstate()
    record = {
        "format": savedir.FORMAT, "format_version": FORMAT_VERSION, "step": step,
        "tensors_sha256": _sha256(tmp / TENSORS_FILE),
        "python_rng": [version, list(internal), gauss],
        "torch_rng": torch.get_rng_state().tolist(),
        "optimizer": optimizer_record,
        "config": asdict(config) if config is not None else None,
    }
    with open(tmp / RECORD_FILE, "x") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def save_state(directory: str | Path, policy, optimizer, step: int, rng: random.Random, config=None,
               write: bool = True) -> Path | None:
    """Write the state after ``step`` as the directory's new current version. Across
    ranks every rank calls it (the shards are gathered) and only the one with ``write``
    writes."""
    tensors, optimizer_record = _tensors(policy, optimizer)
    if not write:
        return None
    return savedir.write_version(directory, step,
                                 lambda tmp: _write(tmp, tensors, optimizer_record, step, rng, config))


# -- loading ------------------------------------------------------------------------------
class _Damaged(QuantrollError):
    pass


def _check(ok: bool, where: Path, what: str) -> None:
    if not ok:
        raise _Damaged(f"--load: {where} is damaged ({what}); resume from another save, or start over with --force")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _python_rng(value, where: Path) -> tuple:
    _check(isinstance(value, list) and len(value) == 3, where, "python_rng is not [version, state, gauss]")
    version, internal, gauss = value
    _check(_is_int(version) and isinstance(internal, list) and len(internal) == 625
           and all(_is_int(x) and 0 <= x < 2**32 for x in internal), where, "python_rng's state is not 625 integers")
    _check(gauss is None or isinstance(gauss, float), where, "python_rng's gauss is not a number")
    return version, tuple(internal), gauss


def _torch_rng(value, where: Path) -> torch.Tensor:
    size = torch.get_rng_state().numel()
    _check(isinstance(value, list) and len(value) == size and all(_is_int(x) and 0 <= x < 256 for x in value),
           where, f"torch_rng is not {size} bytes")
    return torch.tensor(value, dtype=torch.uint8)


def _read_record(version: Path, step: int) -> dict:
    where = version / RECORD_FILE
    record = read_json(where, "trainer state", fix="resume from another save, or start over with --force")
    _check(record.get("format") == savedir.FORMAT and record.get("format_version") == FORMAT_VERSION, where,
           f"not a {savedir.FORMAT} record of version {FORMAT_VERSION}")
    _check(record.get("step") == step and _is_int(record.get("step")), where,
           f"its step is {record.get('step')!r}, the pointer says {step}")
    _check(isinstance(record.get("tensors_sha256"), str), where, "no checksum of the tensors")
    opt = record.get("optimizer")
    _check(isinstance(opt, dict) and isinstance(opt.get("param_groups"), list)
           and isinstance(opt.get("state"), dict), where, "the optimizer record is missing or malformed")
    return record


def _read_tensors(version: Path, record: dict) -> dict[str, torch.Tensor]:
    path = version / TENSORS_FILE
    _check(path.is_file(), path, "missing")
    try:
        read_header(path)  # a truncated, random or malformed file
    except QuantrollError as err:
        raise _Damaged(f"--load: {path} is damaged ({err}); resume from another save, or start over with --force") \
            from None
    _check(_sha256(path) == record["tensors_sha256"], path, "its bytes changed since the save: checksum mismatch")
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as err:  # the Rust library's own error types
        raise _Damaged(f"--load: {path} is damaged ({err}); resume from another save, or start over with --force") \
            from None


def _optimizer_state(record: dict, tensors: dict, optimizer, where: Path) -> dict:
    """The AdamW state_dict the record and tensors describe, checked against ``optimizer``."""
    params = optimizer.params
    groups = record["optimizer"]["param_groups"]
    current = optimizer.inner.param_groups
    _check(len(groups) == len(current) and all(isinstance(g, dict) for g in groups), where,
           "its optimizer has another number of parameter groups")
    fixed = []
    for saved, now in zip(groups, current):
        _check(isinstance(saved.get("params"), list) and len(saved["params"]) == len(now["params"]), where,
               "its optimizer holds another number of parameters")
        _check(all(isinstance(v, (int, float, bool, str, list, type(None))) for v in saved.values()), where,
               "an optimizer setting is not a number")
        g = dict(saved)
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        fixed.append(g)
    state = {}
    for index, entry in record["optimizer"]["state"].items():
        _check(index.isdigit() and int(index) < len(params) and isinstance(entry, dict)
               and isinstance(entry.get("tensors"), list) and isinstance(entry.get("scalars"), dict), where,
               f"optimizer state {index!r} is malformed")
        shape = tuple(params[int(index)].shape)
        values = dict(entry["scalars"])
        for key in entry["tensors"]:
            name = f"adam.{index}.{key}"
            _check(name in tensors, where, f"tensor {name} is missing")
            t = tensors[name]
            _check(t.is_floating_point() and (t.dim() == 0 if key == "step" else tuple(t.shape) == shape), where,
                   f"tensor {name} is {t.dtype} {list(t.shape)}, not the moments of a {list(shape)} parameter")
            values[key] = t
        state[int(index)] = values
    return {"state": state, "param_groups": fixed}


def load_state(directory: str | Path, policy, optimizer, rng: random.Random, source: str = "the trainer's checkpoint"
               ) -> int:
    """Restore in place; returns the last finished step. ``source`` names where the
    trainer's model came from (the flag), for the error when the save does not fit it."""
    saved = savedir.latest(directory)
    if saved is None:
        raise QuantrollError(f"--load {directory}: no saved state there; point it at a directory written by --save")
    record = _read_record(saved.path, saved.step)
    where = saved.path / TENSORS_FILE
    python_rng = _python_rng(record.get("python_rng"), saved.path / RECORD_FILE)
    torch_rng = _torch_rng(record.get("torch_rng"), saved.path / RECORD_FILE)
    tensors = _read_tensors(saved.path, record)
    model = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    check_saved_model_fits(directory, model, policy.state_dict(), source)
    for name, t in model.items():
        _check(t.is_floating_point(), where, f"tensor model.{name} is {t.dtype}, not floating point")
    masters = []
    for i, p in enumerate(optimizer.params):
        t = tensors.get(f"master.{i}")
        _check(t is not None, where, f"tensor master.{i} is missing")
        _check(t.dtype == torch.float32 and tuple(t.shape) == tuple(p.shape), where,
               f"tensor master.{i} is {t.dtype} {list(t.shape)}, not float32 {list(p.shape)}")
        masters.append(t)
    inner = _optimizer_state(record, tensors, optimizer, saved.path / RECORD_FILE)
    if not getattr(optimizer, "writes_params_on_load", False):  # a sharded optimizer sets them from the masters
        policy.load_state_dict(model, strict=False)
    try:
        optimizer.load_state_dict({"master": masters, "inner": inner})
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise _Damaged(f"--load: {saved.path} does not fit this optimizer ({err}); resume from another save, or "
                       "start over with --force") from None
    rng.setstate(python_rng)
    torch.set_rng_state(torch_rng)
    return saved.step


def check_saved_model_fits(directory, saved: dict, current: dict, source: str) -> None:
    """Every tensor of the saved policy must exist in the trainer's model with its shape,
    and every trained tensor of that model must be saved (the rotary caches are rebuilt,
    not saved): otherwise one line naming the first tensor that differs."""
    hint = f"resume with the checkpoint the state was trained from as {source}"
    for name in sorted(saved):
        if name not in current:
            raise QuantrollError(f"--load {directory}: the saved model has {name}, which {source}'s model lacks; {hint}")
        if tuple(saved[name].shape) != tuple(current[name].shape):
            raise QuantrollError(f"--load {directory}: the saved {name} is {list(saved[name].shape)} but {source}'s "
                                 f"model has {list(current[name].shape)}; {hint}")
    missing = sorted(n for n in current if n not in saved and "rotary" not in n)
    if missing:
        raise QuantrollError(f"--load {directory}: the save lacks {missing[0]} of {source}'s model; {hint}")

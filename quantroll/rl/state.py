"""Resumable training state: ``--save DIR --save-interval N`` and ``--load DIR``.

A state is data only, never code: the tensors (the policy's BF16 weights, the FP32
master weights, the AdamW moments) in safetensors, everything else (the last finished
step, the Python and torch RNG states as integers, the optimizer's settings, the run's
config) in JSON. Nothing is unpickled: a ``trainer_state.pt`` planted or left by an
older quantroll is refused unread, because ``torch.load`` of a pickle runs whatever the
file's author put in it.

Two forms: one process writes every tensor whole into ``state.safetensors``; the ranks of
an FSDP2 run each write their own shards (quantroll/rl/state_shards.py). Either resumes
on any number of ranks.

Loading checks everything before it changes anything: the JSON's fields and types,
the tensor files' headers (a truncated or random file), their checksums (bytes changed
since the save), every tensor's name, dtype and shape against the model and optimizer
being resumed. Each problem is one line naming the file. The directory around a state
(versions, the pointer, atomic replacement) is quantroll/rl/savedir.py; the files,
quantroll/rl/state_files.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from quantroll.errors import QuantrollError
from quantroll.rl import savedir, state_shards
from quantroll.rl.state_files import (RECORD_FILE, WHOLE, Damaged, check, masters, optimizer_state,
                                      optimizer_tensors, python_rng, read_record, read_tensors, torch_rng,
                                      write_record, write_tensors)

TENSORS_FILE = "state.safetensors"


def _sharded_ctx(optimizer):
    """The trainer ranks' context when the optimizer holds FSDP2 shards (None: whole). One
    trainer rank beside engine ranks of their own still holds DTensors: its save is
    sharded too, one file of one shard."""
    return getattr(optimizer, "ctx", None)


# -- saving -------------------------------------------------------------------------------
def save_state(directory: str | Path, policy, optimizer, step: int, rng: random.Random, config=None,
               write: bool = True) -> Path | None:
    """Write the state after ``step`` as the directory's new current version. Across
    ranks every rank calls it and writes its own shards (``write`` is then ignored); in
    one process, ``write=False`` writes nothing."""
    ctx = _sharded_ctx(optimizer)
    if ctx is not None:
        state_shards.save(directory, policy, optimizer, step, rng, config, ctx)
        return None
    if not write:
        return None
    tensors = {f"model.{k}": v for k, v in policy.state_dict().items()}  # one process: nothing is sharded
    opt, optimizer_record = optimizer_tensors(*optimizer.export())
    tensors.update(opt)

    def write_whole(tmp: Path) -> None:
        checksum = write_tensors(tmp / TENSORS_FILE, tensors)
        write_record(tmp, WHOLE, step, rng, optimizer_record, config, tensors_sha256=checksum)

    return savedir.write_version(directory, step, write_whole)


# -- loading ------------------------------------------------------------------------------
def load_state(directory: str | Path, policy, optimizer, rng: random.Random, source: str = "the trainer's checkpoint"
               ) -> int:
    """Restore in place; returns the last finished step. ``source`` names where the
    trainer's model came from (the flag), for the error when the save does not fit it."""
    saved = savedir.latest(directory)
    if saved is None:
        raise QuantrollError(f"--load {directory}: no saved state there; point it at a directory written by --save")
    record = read_record(saved.path, saved.step)
    where = saved.path / RECORD_FILE
    python_state = python_rng(record.get("python_rng"), where)
    torch_state = torch_rng(record.get("torch_rng"), where)
    if record["format_version"] == WHOLE:
        tensors = read_tensors(saved.path / TENSORS_FILE, record.get("tensors_sha256"))
        model_shapes, local = {k[len("model."):]: tuple(v.shape) for k, v in tensors.items()
                               if k.startswith("model.")}, False
    else:
        tensors, model_shapes, local = state_shards.read(saved.path, record, optimizer)
    check_saved_model_fits(directory, model_shapes, {k: tuple(v.shape) for k, v in policy.state_dict().items()},
                           source)
    model = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    for name, t in model.items():
        check(t.is_floating_point(), where, f"tensor model.{name} is {t.dtype}, not floating point")
    shapes = [tuple(m.shape) for m in optimizer.master] if local else [tuple(p.shape) for p in optimizer.params]
    state = {"master": masters(tensors, shapes, where), "inner": optimizer_state(record, tensors, optimizer, shapes,
                                                                                  where)}
    try:
        if local:  # this rank's own shards: the masters, and the parameters rounded from them
            optimizer.load_local_state_dict(state)
        else:
            if not getattr(optimizer, "writes_params_on_load", False):  # a sharded optimizer sets them from masters
                policy.load_state_dict(model, strict=False)
            optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise Damaged(f"--load: {saved.path} does not fit this optimizer ({err}); resume from another save, or "
                      "start over with --force") from None
    rng.setstate(python_state)
    torch.set_rng_state(torch_state)
    return saved.step


def changed_settings(directory: str | Path, config) -> list[str]:
    """What a resumed run changes against the settings its save was made with ('optimizer.lr
    0.0002 -> 0.001'), outputs and --num-rollout aside: a resume may change them on purpose,
    and said nothing. Empty when the save holds no settings."""
    from dataclasses import asdict

    saved = savedir.latest(directory)
    before = read_record(saved.path, saved.step).get("config") if saved else None
    if not isinstance(before, dict):
        return []
    now, out = asdict(config), []
    for stage, values in now.items():
        old = before.get(stage)
        for key, value in values.items():
            if stage == "output" or (stage, key) == ("rollout", "num_rollout") or not isinstance(old, dict):
                continue
            was = old.get(key)
            if was != (list(value) if isinstance(value, tuple) else value):
                out.append(f"{stage}.{key} {was!r} -> {value!r}")
    return out


def check_saved_model_fits(directory, saved: dict[str, tuple], current: dict[str, tuple], source: str) -> None:
    """Every tensor of the saved policy must exist in the trainer's model with its shape,
    and every trained tensor of that model must be saved (the rotary caches are rebuilt,
    not saved): otherwise one line naming the first tensor that differs. Shapes by name."""
    hint = f"resume with the checkpoint the state was trained from as {source}"
    for name in sorted(saved):
        if name not in current:
            raise QuantrollError(f"--load {directory}: the saved model has {name}, which {source}'s model lacks; {hint}")
        if tuple(saved[name]) != tuple(current[name]):
            raise QuantrollError(f"--load {directory}: the saved {name} is {list(saved[name])} but {source}'s "
                                 f"model has {list(current[name])}; {hint}")
    missing = sorted(n for n in current if n not in saved and "rotary" not in n)
    if missing:
        raise QuantrollError(f"--load {directory}: the save lacks {missing[0]} of {source}'s model; {hint}")

"""Resumable training state: ``--save DIR --save-interval N`` and ``--load DIR``.

A save holds the policy's BF16 weights, the optimizer (FP32 master weights and AdamW
moments), the RNG states and the last finished step, written atomically (a crash
mid-save leaves the previous save intact). Resuming continues the metrics file: lines
of steps after the saved one (written before a crash) are dropped, so the file ends up
with every step exactly once.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from quantroll.checkpoint.atomic import atomic_directory
from quantroll.errors import QuantrollError

STATE_FILE = "trainer_state.pt"


def save_state(directory: str | Path, policy, optimizer, step: int, rng: random.Random) -> None:
    with atomic_directory(directory, force=True) as tmp:
        torch.save({
            "step": step,
            "model": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "python_rng": rng.getstate(),
            "torch_rng": torch.get_rng_state(),
        }, tmp / STATE_FILE)
        (tmp / "step.json").write_text(json.dumps({"step": step}) + "\n")


def load_state(directory: str | Path, policy, optimizer, rng: random.Random, source: str = "the trainer's checkpoint"
               ) -> int:
    """Restore in place; returns the last finished step. ``source`` names where the
    trainer's model came from (the flag), for the error when the save does not fit it."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise QuantrollError(f"--load {directory}: {STATE_FILE} not found; point it at a directory written by --save")
    state = torch.load(path, map_location="cpu", weights_only=False)
    check_saved_model_fits(directory, state["model"], policy.state_dict(), source)
    policy.load_state_dict(state["model"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    rng.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])


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


def truncate_metrics(path: str | Path | None, last_step: int) -> None:
    """Keep only the lines of steps <= last_step (a crash may have written later ones)."""
    if not path or not Path(path).is_file():
        return
    lines = Path(path).read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("step", -1) <= last_step]
    Path(path).write_text("".join(line + "\n" for line in kept))

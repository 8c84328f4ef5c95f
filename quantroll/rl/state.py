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


def load_state(directory: str | Path, policy, optimizer, rng: random.Random) -> int:
    """Restore in place; returns the last finished step."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise QuantrollError(f"--load {directory}: {STATE_FILE} not found; point it at a directory written by --save")
    state = torch.load(path, map_location="cpu", weights_only=False)
    missing, unexpected = policy.load_state_dict(state["model"], strict=False)
    if [m for m in missing if "rotary" not in m] or unexpected:
        raise QuantrollError(f"--load {directory}: the saved model does not match --ref-load's architecture")
    optimizer.load_state_dict(state["optimizer"])
    rng.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])


def truncate_metrics(path: str | Path | None, last_step: int) -> None:
    """Keep only the lines of steps <= last_step (a crash may have written later ones)."""
    if not path or not Path(path).is_file():
        return
    lines = Path(path).read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("step", -1) <= last_step]
    Path(path).write_text("".join(line + "\n" for line in kept))

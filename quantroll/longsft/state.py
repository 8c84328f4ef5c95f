"""The long SFT's training state, saved every N steps so that a killed run resumes.

``DIR/state`` holds ``tensors.safetensors`` (the FP32 master weights and AdamW's moments
and step counts, by parameter index) and ``record.json`` (the last finished step, the loss
of every step so far, the quality checks, AdamW's param groups, and the recipe). It is
written to a temporary directory and swapped into place whole (checkpoint/atomic.py), so
a kill leaves the previous state or the new one, never a mix. The step's data depend on
(seed, step) alone (batches.py), so nothing else is needed to continue exactly: the
resumed run's losses are the uninterrupted run's, bit for bit, on the same machine.

Nothing here is unpickled: tensors in safetensors, the rest JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quantroll.checkpoint.atomic import atomic_directory
from quantroll.errors import QuantrollError
from quantroll.trainer.optimizer import MasterWeightAdamW

STATE = "state"
TENSORS, RECORD = "tensors.safetensors", "record.json"


def save(directory: Path, optimizer: MasterWeightAdamW, step: int, losses: list[float], checks: list[dict],
         recipe: dict, before: dict | None = None) -> None:
    """``before``: the greedy evaluation of the initial model, which a resumed run reports too."""
    masters, inner = optimizer.export()
    tensors = {f"master.{i}": m.detach().to("cpu").contiguous() for i, m in enumerate(masters)}
    for i, s in inner["state"].items():
        for key, value in s.items():
            tensors[f"{key}.{i}"] = torch.as_tensor(value).detach().to("cpu").contiguous()
    record = {"step": step, "losses": losses, "checks": checks, "param_groups": inner["param_groups"],
              "recipe": recipe, "before": before}
    with atomic_directory(Path(directory) / STATE, force=True) as tmp:
        save_file(tensors, str(tmp / TENSORS))
        (tmp / RECORD).write_text(json.dumps(record) + "\n")


def exists(directory: Path) -> bool:
    return (Path(directory) / STATE / RECORD).is_file()


def load(directory: Path, optimizer: MasterWeightAdamW, recipe: dict) -> tuple[int, list[float], list[dict], dict | None]:
    """Restore ``optimizer`` (and through it the model's weights); returns (the last finished
    step, the losses so far, the quality checks so far, the initial model's evaluation). The
    recipe must be the saved one."""
    where = Path(directory) / STATE
    try:
        record = json.loads((where / RECORD).read_text())
        tensors = load_file(str(where / TENSORS))
    except (OSError, ValueError) as err:
        raise QuantrollError(f"cannot read the SFT state in {where} ({err}); start over without --resume") from None
    saved = record.get("recipe")
    if saved != recipe:
        diff = sorted(k for k in set(saved or {}) | set(recipe) if (saved or {}).get(k) != recipe.get(k))
        raise QuantrollError(f"--resume: the state in {where} was made with other settings ({', '.join(diff)}); "
                             "resume with the same ones or choose another --state-dir")
    n = len(optimizer.master)
    if any(f"master.{i}" not in tensors or tensors[f"master.{i}"].shape != optimizer.master[i].shape for i in range(n)):
        raise QuantrollError(f"--resume: the state in {where} does not fit this model's parameters")
    device = optimizer.master[0].device
    state = {}
    for i in range(n):
        keys = [k for k in ("step", "exp_avg", "exp_avg_sq") if f"{k}.{i}" in tensors]
        if keys:
            state[i] = {k: tensors[f"{k}.{i}"].to(device if k != "step" else "cpu") for k in keys}
    optimizer.load_state_dict({"master": [tensors[f"master.{i}"].to(device) for i in range(n)],
                               "inner": {"state": state, "param_groups": record["param_groups"]}})
    return int(record["step"]), [float(x) for x in record["losses"]], list(record["checks"]), record.get("before")

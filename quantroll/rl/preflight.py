"""Checks of a training run's output paths before any work: a path that cannot be
written fails now, not after the last step, and a directory the run would replace must
be one it wrote itself (or empty), never the user's data."""

from __future__ import annotations

import json
from pathlib import Path

from quantroll.errors import QuantrollError
from quantroll.outputs import check_output_path
from quantroll.rl.config import TrainConfig
from quantroll.rl.state import STATE_FILE


def _non_empty_dir(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _is_quantroll_conversion(path: Path) -> bool:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "quantroll" in (config.get("quantization_config") or {})


def check_outputs(cfg: TrainConfig) -> None:
    """Refuse output paths the run could not write, or whose contents it would destroy."""
    for flag, value, is_file in (("--metrics-file", cfg.metrics_file, True),
                                 ("--tensorboard-dir", cfg.tensorboard_dir, False), ("--save", cfg.save, False),
                                 ("--save-hf", cfg.save_hf, False), ("--convert-dir", cfg.convert_dir, False)):
        if value:
            check_output_path(flag, value, is_file=is_file)
    if cfg.save_hf and _non_empty_dir(Path(cfg.save_hf)):
        raise QuantrollError(f"--save-hf {cfg.save_hf} exists and is not empty; the export would replace it: remove it "
                             "or choose another directory")
    if cfg.save and _non_empty_dir(Path(cfg.save)) and not (Path(cfg.save) / STATE_FILE).is_file():
        raise QuantrollError(f"--save {cfg.save} exists, is not empty and holds no {STATE_FILE} (not a state directory "
                             "of a previous run); remove it or choose another directory")
    if cfg.convert_dir and _non_empty_dir(Path(cfg.convert_dir)) and not _is_quantroll_conversion(Path(cfg.convert_dir)):
        raise QuantrollError(f"--convert-dir {cfg.convert_dir} exists and is not a quantroll conversion; the run would "
                             "replace it: remove it or choose another directory")

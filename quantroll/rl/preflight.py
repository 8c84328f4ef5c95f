"""Checks of a training run's output paths before any work: a path that cannot be
written fails now, not after the last step, and a directory the run would replace must
be one it wrote itself (or empty), never the user's data."""

from __future__ import annotations

from pathlib import Path

from quantroll.errors import QuantrollError
from quantroll.inputs import read_json
from quantroll.outputs import check_output_path
from quantroll.rl import savedir
from quantroll.rl.config import TrainConfig


def _non_empty_dir(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _is_quantroll_conversion(path: Path) -> bool:
    try:
        config = read_json(path / "config.json", "config")
    except QuantrollError:
        return False
    return "quantroll" in (config.get("quantization_config") or {})


def check_outputs(cfg: TrainConfig) -> None:
    """Refuse output paths the run could not write, or whose contents it would destroy."""
    for flag, value, is_file in (("--metrics-file", cfg.output.metrics_file, True),
                                 ("--tensorboard-dir", cfg.output.tensorboard_dir, False), ("--save", cfg.output.save, False),
                                 ("--save-hf", cfg.output.save_hf, False), ("--convert-dir", cfg.models.convert_dir, False)):
        if value:
            check_output_path(flag, value, is_file=is_file)
    if cfg.output.save_hf and _non_empty_dir(Path(cfg.output.save_hf)):
        raise QuantrollError(f"--save-hf {cfg.output.save_hf} exists and is not empty; the export would replace it: remove it "
                             "or choose another directory")
    if cfg.output.save and (foreign := savedir.foreign_entries(cfg.output.save)):
        raise QuantrollError(f"--save {cfg.output.save} holds {foreign[0]!r}, which no save wrote (not a state directory of a "
                             "previous run); remove it or choose another directory")
    if cfg.models.convert_dir and _non_empty_dir(Path(cfg.models.convert_dir)) and not _is_quantroll_conversion(Path(cfg.models.convert_dir)):
        raise QuantrollError(f"--convert-dir {cfg.models.convert_dir} exists and is not a quantroll conversion; the run would "
                             "replace it: remove it or choose another directory")
    for flag, value in (("--save-hf", cfg.output.save_hf), ("--convert-dir", cfg.models.convert_dir), ("--metrics-file", cfg.output.metrics_file),
                        ("--tensorboard-dir", cfg.output.tensorboard_dir)):
        if cfg.output.save and value and Path(value).absolute() == Path(cfg.output.save).absolute():
            raise QuantrollError(f"{flag} and --save are both {value}; give each its own path")

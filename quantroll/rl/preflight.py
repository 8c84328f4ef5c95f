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
    out, convert_dir = cfg.output, cfg.models.convert_dir
    for flag, value, is_file in (("--metrics-file", out.metrics_file, True),
                                 ("--tensorboard-dir", out.tensorboard_dir, False), ("--save", out.save, False),
                                 ("--save-hf", out.save_hf, False), ("--convert-dir", convert_dir, False)):
        if value:
            check_output_path(flag, value, is_file=is_file)
    if out.save_hf and _non_empty_dir(Path(out.save_hf)):
        raise QuantrollError(f"--save-hf {out.save_hf} exists and is not empty; the export would replace it: remove it "
                             "or choose another directory")
    if out.save and (foreign := savedir.foreign_entries(out.save)):
        raise QuantrollError(f"--save {out.save} holds {foreign[0]!r}, which no save wrote (not a state directory of a "
                             "previous run); remove it or choose another directory")
    if convert_dir and _non_empty_dir(Path(convert_dir)) and not _is_quantroll_conversion(Path(convert_dir)):
        raise QuantrollError(f"--convert-dir {convert_dir} exists and is not a quantroll conversion; the run would "
                             "replace it: remove it or choose another directory")
    for flag, value in (("--save-hf", out.save_hf), ("--convert-dir", convert_dir), ("--metrics-file", out.metrics_file),
                        ("--tensorboard-dir", out.tensorboard_dir)):
        if out.save and value and Path(value).absolute() == Path(out.save).absolute():
            raise QuantrollError(f"{flag} and --save are both {value}; give each its own path")

"""Checks of a training run's output paths before any work: a path that cannot be
written fails now, not after the last step, and a directory the run would replace must
be one it wrote itself (or empty), never the user's data."""

from __future__ import annotations

from pathlib import Path

from quantroll.builtin import builtin_checkpoint
from quantroll.errors import QuantrollError
from quantroll.outputs import check_output_path, check_replace, refuse_foreign
from quantroll.rl import savedir
from quantroll.rl.config import TrainConfig


def check_outputs(cfg: TrainConfig) -> None:
    """Refuse output paths the run could not write, or whose contents it would destroy
    (quantroll/outputs.py's rule: only what quantroll wrote is replaced, only with --force;
    --convert-dir is a cache of the conversion, replaced at each run when quantroll wrote it)."""
    out, convert_dir = cfg.output, cfg.models.convert_dir
    for flag, value, is_file in (("--metrics-file", out.metrics_file, True),
                                 ("--tensorboard-dir", out.tensorboard_dir, False), ("--save", out.save, False),
                                 ("--save-hf", out.save_hf, False), ("--convert-dir", convert_dir, False)):
        if value:
            check_output_path(flag, value, is_file=is_file)
    if out.save_hf:
        check_replace(f"--save-hf {out.save_hf}", out.save_hf, out.force)
    if out.save:
        refuse_foreign(f"--save {out.save}", out.save, also_ours=savedir.written_by_a_save)
    if convert_dir:
        check_replace(f"--convert-dir {convert_dir}", convert_dir, force=True)
    for flag, value in (("--save-hf", out.save_hf), ("--convert-dir", convert_dir), ("--metrics-file", out.metrics_file),
                        ("--tensorboard-dir", out.tensorboard_dir)):
        if out.save and value and Path(value).absolute() == Path(out.save).absolute():
            raise QuantrollError(f"{flag} and --save are both {value}; give each its own path")


def check_memory(cfg: TrainConfig, shards: int = 1) -> None:
    """The sizes asked for fit the device (rl/memory.py's lower-bound estimate; ``shards``:
    trainer ranks splitting the trainer), before the problem pools are even made."""
    from quantroll.rl.memory import check_fits

    source = Path(cfg.models.hf_checkpoint) if cfg.models.hf_checkpoint else builtin_checkpoint(cfg.models.builtin_model)
    if (source / "config.json").is_file():  # a missing or damaged checkpoint is refused later, by its reader
        check_fits(cfg, source, shards=shards)

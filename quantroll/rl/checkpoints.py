"""Which checkpoint the engine loads and which the trainer loads.

Three ways in, one answer (engine_dir, trainer_dir):
- nothing given: the built-in warm-started tiny Qwen3 (dense or MoE), BF16 on both sides;
- ``--hf-checkpoint`` (+ ``--ref-load`` when it is quantized: mode 1), as in Miles;
- ``--rollout-precision fp8|mxfp8|nvfp4`` with a BF16 ``--hf-checkpoint`` (or the
  built-in): quantroll converts it with the same rules as ``quantroll convert``
  (``--num-layers-at-start/end-in-bf16`` and ``--skip`` included) into ``--convert-dir`` or a
  temporary directory, the engine loads the conversion and the trainer the BF16 source.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator

from quantroll.builtin import builtin_checkpoint
from quantroll.checkpoint.convert import ConvertConfig, convert_checkpoint
from quantroll.errors import QuantrollError
from quantroll.inputs import read_json
from quantroll.rl.config import TrainConfig


def _quantization(checkpoint: Path) -> dict | None:
    path = checkpoint / "config.json"
    if not path.is_file():
        raise QuantrollError(f"--hf-checkpoint {checkpoint}: config.json not found; point it at an HF checkpoint "
                             "directory (or leave it out for the built-in model)")
    qc = read_json(path, "--hf-checkpoint's config", fix="fix or re-download it").get("quantization_config")
    generation = checkpoint / "generation_config.json"
    if generation.is_file():  # the engine reads it too: refused here in one line, before any work
        read_json(generation, "generation config", fix="fix or delete it")
    return qc if isinstance(qc, dict) else None


@contextlib.contextmanager
def resolve_checkpoints(cfg: TrainConfig) -> Iterator[tuple[Path, Path]]:
    """Yield (engine checkpoint, trainer checkpoint); a temporary conversion is removed
    on exit. The trainer's is never quantized (mode 1 needs --ref-load)."""
    models = cfg.models
    source = Path(models.hf_checkpoint) if models.hf_checkpoint else builtin_checkpoint(models.builtin_model)
    ref = Path(models.ref_load) if models.ref_load else None
    quantization = _quantization(source)
    wants_layers = models.num_layers_at_start_in_bf16 or models.num_layers_at_end_in_bf16 or models.skip
    if models.rollout_precision in (None, "bf16"):
        if models.rollout_precision == "bf16" and quantization:
            raise QuantrollError(f"--rollout-precision bf16 but --hf-checkpoint {source} is quantized; give the BF16 "
                                 "checkpoint")
        if wants_layers and not quantization:
            raise QuantrollError("--num-layers-at-start/end-in-bf16 and --skip need a low-precision rollout: add "
                                 "--rollout-precision fp8|mxfp8|nvfp4 (or convert the checkpoint with those flags)")
        if wants_layers:
            raise QuantrollError(f"--hf-checkpoint {source} is already quantized: its BF16 layers were chosen when it "
                                 "was converted (quantroll convert --num-layers-at-start/end-in-bf16, --skip); drop "
                                 "the flags "
                                 "here, or give the BF16 checkpoint with --rollout-precision")
        if quantization and ref is None:
            method = quantization.get("quant_algo") or quantization.get("quant_method")
            raise QuantrollError(
                f"--hf-checkpoint {source} is quantized ({method}) and no --ref-load was given: the trainer must not "
                "train on quantized weights. Mode 1 (quantized rollout, BF16 training) needs the BF16 checkpoint as "
                "--ref-load (or give the BF16 checkpoint with --rollout-precision)")
        yield source, ref or source
        return
    if quantization:
        raise QuantrollError(f"--rollout-precision {models.rollout_precision} converts a BF16 checkpoint, but "
                             f"--hf-checkpoint {source} is already quantized; give its BF16 source instead")
    if ref is not None and ref != source:
        raise QuantrollError("--rollout-precision converts --hf-checkpoint and trains on it; --ref-load is not used "
                             "then (leave it out)")
    convert = ConvertConfig(format=models.rollout_precision, num_layers_at_start_in_bf16=models.num_layers_at_start_in_bf16,
                            num_layers_at_end_in_bf16=models.num_layers_at_end_in_bf16, skip=tuple(models.skip), force=True,
                            progress=False)
    if models.convert_dir:  # kept after the run; a conversion quantroll wrote there is replaced, nothing else
        target = Path(models.convert_dir)
        convert_checkpoint(source, target, convert, f"--convert-dir {target}")
        yield target, source
        return
    with tempfile.TemporaryDirectory(prefix="quantroll-rollout-") as tmp:
        target = Path(tmp) / f"{source.name}-{models.rollout_precision}"
        convert_checkpoint(source, target, convert)
        yield target, source

"""What makes a stored checkpoint unusable though its files parse: a quantized weight
whose scale is missing, a scale (or code) that is NaN or Inf.

``inspect`` used to leave such tensors out of its numbers (a NaN SQNR drops out of a
minimum) or, for an FP8 weight whose scale tensor is gone, list the weight as "kept by
the checkpoint producer" and exit 0. These are damage, not choices: each is reported
as an error naming the tensor.
"""

from __future__ import annotations

from pathlib import Path

from quantroll.checkpoint.loader import QuantizedCheckpoint
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.checkpoint.safetensors_header import QUANTIZED_DTYPES
from quantroll.formats.base import invalid_values


def unscaled(reader: CheckpointReader, names) -> list[str]:
    """Weights among ``names`` stored in a quantized dtype (1-byte codes) with no scale."""
    return [n for n in names if n.endswith(".weight") and reader.tensors[n].dtype in QUANTIZED_DTYPES]


def stored_problems(path: str | Path) -> list[str]:
    """One message per unusable tensor, naming it; empty when the checkpoint is sound."""
    with CheckpointReader(path) as reader:
        quantized = isinstance(reader.config.get("quantization_config"), dict)
        if not quantized:
            return [f"tensor '{n}' is stored as {reader.tensors[n].dtype} without a scale (config.json has no "
                    "quantization_config)" for n in unscaled(reader, reader.tensors)]
    problems = []
    with QuantizedCheckpoint(path) as ckpt:
        for name in unscaled(ckpt.reader, ckpt.plain_tensors()):
            problems.append(f"tensor '{name}' is stored as {ckpt.reader.tensors[name].dtype} but its scale tensor is "
                            "missing")
        for module, q in ckpt.iter_quantized():
            if (what := invalid_values(q)) is not None:
                problems.append(f"tensor '{module}.weight' holds {what}")
    return problems

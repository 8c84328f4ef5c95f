"""What a checkpoint holds, and how far its quantized weights are from a BF16 source.

``inspect_checkpoint`` reports the format, which modules are quantized and which are
kept (with the reason, recomputed by plan() from the rules the checkpoint records),
bytes per stored dtype, and optionally the SQNR of every quantized weight against
the BF16 checkpoint it came from:

    SQNR = 10 log10( sum x^2 / sum (x - dequantize(q))^2 )   in dB, sums in float64

where dequantize is the format's own reference (the numbers the engine computes
with). A weight reproduced exactly has SQNR +inf; an all-zero weight, NaN.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from quantroll.checkpoint.convert import num_hidden_layers
from quantroll.checkpoint.loader import QuantizedCheckpoint
from quantroll.checkpoint.plan import KEEP, plan
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.checkpoint.safetensors_header import QUANTIZED_DTYPES
from quantroll.errors import QuantrollError

UNEXPLAINED = "producer-choice"  # kept by whoever made the checkpoint, for a reason plan() does not give


def sqnr_db(x: torch.Tensor, y: torch.Tensor) -> float:
    """10 log10(sum x^2 / sum (x - y)^2), computed in float64 (+inf if equal, nan if x == 0)."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    signal = float((x * x).sum())
    noise = float(((x - y) ** 2).sum())
    if noise == 0.0:
        return math.inf if signal > 0 else math.nan
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


@dataclass
class InspectReport:
    path: str
    format: str  # "fp8" | "mxfp8" | "nvfp4" | "bf16" (not quantized)
    scale_rule: str | None
    producer: str
    num_tensors: int
    num_files: int
    quantized: list[str]
    kept: dict[str, str]  # module -> reason
    bytes_by_dtype: dict[str, int]
    against: str | None = None
    sqnr_db: dict[str, float] = field(default_factory=dict)
    kept_mismatch: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # unusable tensors (checkpoint/integrity.py)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_dtype.values())

    def worst(self, n: int) -> list[tuple[str, float]]:
        """The n quantized modules with the lowest SQNR (NaN last)."""
        items = sorted(self.sqnr_db.items(), key=lambda kv: (math.isnan(kv[1]), kv[1]))
        return items[:n]

    def to_json(self, top: int = 10) -> dict:
        def num(v: float):  # JSON has no inf/nan
            return v if math.isfinite(v) else str(v)

        data = asdict(self)
        data["total_bytes"] = self.total_bytes
        data["kept_by_reason"] = kept_by_reason(self.kept)
        data["sqnr_db"] = {k: num(v) for k, v in self.sqnr_db.items()}
        data["worst"] = [{"module": k, "sqnr_db": num(v)} for k, v in self.worst(top)]
        return data


def kept_by_reason(kept: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for module, reason in kept.items():
        out[reason].append(module)
    return dict(sorted(out.items()))


def inspect_checkpoint(path: str | Path, against: str | Path | None = None) -> InspectReport:
    """Summarize a checkpoint (quantized or not); with ``against``, measure every quantized weight."""
    with CheckpointReader(path) as reader:
        is_quantized = isinstance(reader.config.get("quantization_config"), dict)
        num_tensors, num_files = len(reader.tensors), len(reader.shards)
        totals: Counter = Counter()
        for info in reader.tensors.values():
            totals[info.dtype] += info.nbytes
        bytes_by_dtype = dict(sorted(totals.items()))
    if not is_quantized:
        return InspectReport(str(path), "bf16", None, "unknown", num_tensors, num_files, [], {}, bytes_by_dtype)
    with QuantizedCheckpoint(path) as ckpt:
        report = InspectReport(
            str(path),
            ckpt.format.name,
            getattr(ckpt.format, "scale_rule", None),
            ckpt.spec.producer,
            num_tensors,
            num_files,
            list(ckpt.quantized),
            _kept_reasons(ckpt),
            bytes_by_dtype,
        )
        if against is not None:
            report.against = str(against)
            with CheckpointReader(against) as ref:
                report.sqnr_db, report.kept_mismatch = _compare(ckpt, ref)
    return report


def _kept_reasons(ckpt: QuantizedCheckpoint) -> dict[str, str]:
    """Reason of every kept weight, from plan() rerun on the logical shapes and recorded rules."""
    shapes = {name: ckpt.reader.tensors[name].shape for name in ckpt.plain_tensors()}
    for module in ckpt.quantized:
        q = ckpt.reader.tensors[f"{module}.weight"].shape
        shapes[f"{module}.weight"] = ckpt.format.stored.logical_shape(tuple(q))
    decisions = plan(shapes, ckpt.format, ckpt.spec.rules, num_hidden_layers(ckpt.config)).decisions
    kept = {}
    for name in ckpt.plain_tensors():
        if name.endswith(".weight") and ckpt.reader.tensors[name].dtype in QUANTIZED_DTYPES:
            continue  # quantized codes whose scale is missing: not kept, damaged (checkpoint/integrity.py)
        if name.endswith(".weight"):
            d = decisions[name]
            kept[d.module] = d.reason if d.action == KEEP else UNEXPLAINED
    return kept


def _compare(ckpt: QuantizedCheckpoint, ref: CheckpointReader) -> tuple[dict[str, float], list[str]]:
    sqnr = {}
    for module, q in ckpt.iter_quantized():
        name = f"{module}.weight"
        if name not in ref.tensors:
            raise QuantrollError(f"--against {ref.path} has no tensor '{name}'; pass the BF16 checkpoint this one was made from")
        x = ref.load(name)
        if tuple(x.shape) != tuple(q.shape):
            raise QuantrollError(f"tensor '{name}' is {tuple(x.shape)} in --against {ref.path} but {q.shape} here")
        sqnr[module] = sqnr_db(x, ckpt.format.dequantize(q))
    mismatch = []
    for name in ckpt.plain_tensors():
        if name in ref.tensors:
            a, b = ckpt.tensor(name), ref.load(name)
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                mismatch.append(name)
        else:
            mismatch.append(name)
    return sqnr, mismatch

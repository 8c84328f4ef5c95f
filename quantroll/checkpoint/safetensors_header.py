"""The safetensors file header: dtype names, tensor records, parsing without loading.

A safetensors file is an 8-byte little-endian header length, a JSON header that maps
each tensor name to {dtype, shape, data_offsets}, then the raw bytes. Reading the
header alone tells the converter every shape and dtype of a checkpoint that may be
hundreds of GB, before it touches a single weight, so it can plan and refuse bad
input up front. The writer (writer.py) produces the same header from a plan.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from quantroll.errors import QuantrollError

# safetensors dtype name <-> torch dtype, for every dtype quantroll reads or writes.
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

# Floating dtypes a BF16-style source checkpoint may hold (weights to quantize or keep).
SOURCE_FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")
# Dtypes that only appear in checkpoints that are already quantized.
QUANTIZED_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "U8", "I8")

_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library refuses larger headers too


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file header describes it (nothing loaded)."""

    name: str
    dtype: str  # safetensors name, e.g. "BF16"
    shape: tuple[int, ...]
    file: Path
    offset: int  # start of its bytes within the data section

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors name of a torch dtype (QuantrollError if safetensors has none)."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise QuantrollError(f"dtype {dtype} cannot be stored in safetensors by quantroll") from None


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Tensor records (in data order) and the ``__metadata__`` of one safetensors file.

    Raises QuantrollError naming the file for a truncated/corrupt header and naming
    the tensor for a dtype quantroll does not know.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise QuantrollError(f"{path} is not a safetensors file (shorter than 8 bytes); re-download or re-export it")
            (length,) = struct.unpack("<Q", raw_len)
            if length > _MAX_HEADER:
                raise QuantrollError(f"{path} is not a safetensors file (header length {length}); re-download or re-export it")
            raw = f.read(length)
            size = path.stat().st_size
    except OSError as err:
        raise QuantrollError(f"cannot read {path}: {err.strerror}") from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise QuantrollError(f"{path} has a corrupt safetensors header (not JSON); re-download or re-export it") from None
    if not isinstance(header, dict):
        raise QuantrollError(f"{path} has a corrupt safetensors header (not a JSON object); re-download or re-export it")
    metadata = header.pop("__metadata__", None) or {}
    infos = []
    for name, rec in header.items():
        dtype = rec.get("dtype") if isinstance(rec, dict) else None
        if dtype not in DTYPES:
            raise QuantrollError(
                f"tensor '{name}' in {path.name} has unsupported dtype {dtype!r}; quantroll reads {', '.join(DTYPES)}"
            )
        try:
            shape = tuple(int(d) for d in rec["shape"])
            begin, end = (int(x) for x in rec["data_offsets"])
            if min(shape, default=0) < 0 or begin < 0:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise QuantrollError(f"tensor '{name}' in {path.name} has a malformed header record (shape, data_offsets); "
                                 "re-download or re-export it") from None
        info = TensorInfo(name, dtype, shape, path, begin)
        if end - begin != info.nbytes or 8 + length + end > size:
            raise QuantrollError(
                f"tensor '{name}' in {path.name} has data offsets that do not match its shape or the file size "
                "(truncated download?); re-download or re-export it"
            )
        infos.append(info)
    infos.sort(key=lambda i: i.offset)
    return {i.name: i for i in infos}, dict(metadata)

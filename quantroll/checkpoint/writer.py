"""Stream tensors into a safetensors file, one at a time.

``safetensors.torch.save_file`` needs every tensor of a file in memory at once: a
5 GB shard costs 5 GB of RAM on top of what the converter already holds. The header
depends only on names, dtypes and shapes, which the plan knows before any weight is
read, so this writer emits the header first and then each tensor's bytes as it is
produced. Peak memory is the largest tensor, not the shard. The file is byte-for-byte
a normal safetensors file (8-aligned header, contiguous offsets, ``__metadata__``
``{"format": "pt"}`` so that transformers accepts it).
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from quantroll.checkpoint.safetensors_header import dtype_name

if sys.byteorder != "little":  # safetensors stores little-endian; so does every torch CPU build we run on
    raise ImportError("quantroll's safetensors writer needs a little-endian machine")


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor the writer will receive: its name, dtype and shape, known in advance."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def build_header(planned: Sequence[PlannedTensor], metadata: dict[str, str] | None = None) -> bytes:
    """The length-prefixed JSON header for tensors stored in ``planned`` order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for p in planned:
        if p.name in header:
            raise ValueError(f"tensor '{p.name}' planned twice")
        header[p.name] = {"dtype": dtype_name(p.dtype), "shape": list(p.shape), "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes, as safetensors does
    return struct.pack("<Q", len(raw)) + raw


class StreamingSafetensorsWriter:
    """Write the planned tensors to ``path`` in plan order; each ``write`` is checked.

    A tensor that arrives out of order or with another dtype/shape than planned is a
    bug in the caller, so it raises ValueError rather than writing a corrupt file.
    """

    def __init__(self, path: str | Path, planned: Sequence[PlannedTensor], metadata: dict[str, str] | None = None,
                 sync: bool = False):
        """``sync``: flush the file to disk on close (for state that must survive a crash)."""
        self.path = Path(path)
        self.planned = list(planned)
        self.sync = sync
        self._next = 0
        self._file = open(self.path, "wb")
        self._file.write(build_header(self.planned, metadata))

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self.planned):
            raise ValueError(f"{self.path.name}: tensor '{name}' was not planned (all planned tensors already written)")
        p = self.planned[self._next]
        if name != p.name or tensor.dtype != p.dtype or tuple(tensor.shape) != p.shape:
            raise ValueError(
                f"{self.path.name}: got '{name}' {tensor.dtype} {tuple(tensor.shape)}, planned '{p.name}' {p.dtype} {p.shape}"
            )
        raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        self._file.write(memoryview(raw.numpy()))
        self._next += 1

    def close(self) -> None:
        """Finish the file; raises if any planned tensor never arrived."""
        if self._file.closed:
            return
        if self.sync and self._next == len(self.planned):
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()
        if self._next != len(self.planned):
            missing = self.planned[self._next].name
            raise ValueError(f"{self.path.name}: closed before planned tensor '{missing}' was written")

    def __enter__(self) -> "StreamingSafetensorsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._file.close()  # the caller's atomic directory removes the partial file
            return
        self.close()

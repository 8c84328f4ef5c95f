"""Read a quantized checkpoint back: its format, and QuantizedTensors by module name.

The engine loads its weights through this, and ``inspect`` measures them. A module
is quantized when its scale tensor is present (``weight_scale_inv`` for fp8/mxfp8,
``weight_scale`` for NVFP4); everything else is read as a plain tensor.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from quantroll.checkpoint.layout import from_stored, scale_names
from quantroll.checkpoint.quant_config import QuantSpec, read_quantization_config
from quantroll.checkpoint.reader import CheckpointReader
from quantroll.errors import QuantrollError
from quantroll.formats import Format, QuantizedTensor


class QuantizedCheckpoint:
    """A quantized checkpoint directory. Use as a context manager.

    spec:      QuantSpec (format incl. MXFP8 scale rule, plan rules, producer)
    quantized: module names stored quantized, in file order
    reader:    the underlying CheckpointReader (names, shapes, raw tensors)
    """

    def __init__(self, path: str | Path):
        self.reader = CheckpointReader(path)
        qc = self.reader.config.get("quantization_config")
        if not isinstance(qc, dict):
            raise QuantrollError(
                f"{self.reader.path} has no quantization_config in config.json; it is not a quantized checkpoint "
                "(make one with `quantroll convert`)"
            )
        self.quantization_config = qc
        self.spec: QuantSpec = read_quantization_config(qc, f"{self.reader.path / 'config.json'}")
        first_scale = scale_names(self.format)[0]
        suffix = "." + first_scale
        self.quantized: list[str] = [n[: -len(suffix)] for n in self.reader.tensors if n.endswith(suffix)]
        self._quantized_set = frozenset(self.quantized)
        self._companions = {"weight", *scale_names(self.format)}
        for module in self.quantized:
            for part in self._companions:
                if f"{module}.{part}" not in self.reader.tensors:
                    raise QuantrollError(f"{self.reader.path}: quantized module '{module}' has no tensor '{module}.{part}'")

    @property
    def format(self) -> Format:
        return self.spec.format

    @property
    def path(self) -> Path:
        return self.reader.path

    @property
    def config(self) -> dict:
        return self.reader.config

    def is_quantized(self, module: str) -> bool:
        return module in self._quantized_set

    def quantized_tensor(self, module: str) -> QuantizedTensor:
        """The stored weight of ``module`` as a QuantizedTensor (data, scale[, global])."""
        if f"{module}.{scale_names(self.format)[0]}" not in self.reader.tensors:
            raise QuantrollError(f"{self.path}: module '{module}' is not stored quantized")
        tensors = {f"{module}.{p}": self.reader.load(f"{module}.{p}") for p in self._companions}
        return from_stored(self.format, module, tensors)

    def iter_quantized(self) -> Iterator[tuple[str, QuantizedTensor]]:
        for module in self.quantized:
            yield module, self.quantized_tensor(module)

    def plain_tensors(self) -> list[str]:
        """Names of the tensors that are not part of a quantized module's storage."""
        owned = {f"{m}.{p}" for m in self.quantized for p in self._companions}
        return [n for n in self.reader.tensors if n not in owned]

    def tensor(self, name: str) -> torch.Tensor:
        """A stored tensor as it is on disk."""
        return self.reader.load(name)

    def dequantized(self, module: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.format.dequantize(self.quantized_tensor(module), dtype)

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "QuantizedCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_quantized_checkpoint(path: str | Path) -> QuantizedCheckpoint:
    """Open a quantized checkpoint (validates its config and that every scale has its weight)."""
    return QuantizedCheckpoint(path)

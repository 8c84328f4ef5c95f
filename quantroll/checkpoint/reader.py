"""Read a Hugging Face checkpoint directory: config.json plus safetensors weights.

A checkpoint is either one ``model.safetensors`` or shards listed by
``model.safetensors.index.json``. The reader validates the layout, learns every
tensor's name, dtype and shape from the headers alone, and loads tensors one at a
time (memory-mapped by ``safe_open``), so converting a model never needs more memory
than its largest tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from quantroll import inputs
from quantroll.checkpoint.safetensors_header import TensorInfo, read_header
from quantroll.errors import QuantrollError

CONFIG = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``; QuantrollError naming the file if it is not one
    (quantroll/inputs.py: missing, unreadable, not UTF-8, not JSON, not an object)."""
    return inputs.read_json(path, what, dict, fix="fix or re-download it")


class CheckpointReader:
    """A validated checkpoint directory. Use as a context manager (closes open files).

    Attributes:
        path:    the directory
        config:  config.json as a dict
        shards:  weight file names in order (one entry for a single-file checkpoint)
        sharded: True when an index file lists the shards
        tensors: name -> TensorInfo, ordered by shard then by position in the file
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise QuantrollError(f"checkpoint directory {self.path} does not exist; pass a Hugging Face model directory")
        if not self.path.is_dir():
            raise QuantrollError(f"{self.path} is not a directory; pass a Hugging Face model directory, not a file")
        if not (self.path / CONFIG).is_file():
            raise QuantrollError(
                f"{self.path} has no config.json, so it is not a Hugging Face checkpoint; pass the directory save_pretrained wrote"
            )
        self.config = read_json(self.path / CONFIG, "config")
        self.sharded, self.shards, weight_map = self._find_weights()
        self.tensors = self._read_headers(weight_map)
        self._handles: dict[Path, object] = {}

    def _find_weights(self) -> tuple[bool, list[str], dict[str, str] | None]:
        index = self.path / INDEX_FILE
        if index.is_file():
            data = read_json(index, "index")
            weight_map = data.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise QuantrollError(f"index {index} has no 'weight_map'; re-download or re-export the checkpoint")
            shards = sorted(set(weight_map.values()))
            for shard in shards:
                if not (self.path / shard).is_file():
                    raise QuantrollError(
                        f"index {index.name} lists shard {shard}, which is missing from {self.path}; re-download the checkpoint"
                    )
            return True, shards, weight_map
        if (self.path / SINGLE_FILE).is_file():
            return False, [SINGLE_FILE], None
        found = sorted(p.name for p in self.path.glob("*.safetensors"))
        if found:
            raise QuantrollError(
                f"{self.path} has {found[0]} but neither {SINGLE_FILE} nor {INDEX_FILE}; add an index or rename the file"
            )
        raise QuantrollError(
            f"{self.path} has no safetensors weights ({SINGLE_FILE} or {INDEX_FILE}); "
            "convert .bin weights with save_pretrained(safe_serialization=True) first"
        )

    def _read_headers(self, weight_map: dict[str, str] | None) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        for shard in self.shards:
            infos, _ = read_header(self.path / shard)
            for name, info in infos.items():
                if weight_map is not None and weight_map.get(name) != shard:
                    continue  # the index is the truth, as in transformers
                tensors[name] = info
        if weight_map is not None:
            for name, shard in weight_map.items():
                if name not in tensors:
                    raise QuantrollError(
                        f"index {INDEX_FILE} places tensor '{name}' in {shard}, which does not hold it; re-download the checkpoint"
                    )
        return tensors

    # -- loading ------------------------------------------------------------------------
    def shard_tensors(self, shard: str) -> list[TensorInfo]:
        """The tensors of one shard, in file order."""
        return [i for i in self.tensors.values() if i.file.name == shard]

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise QuantrollError(f"checkpoint {self.path} has no tensor '{name}'") from None

    def load(self, name: str) -> torch.Tensor:
        """One tensor, read into memory (CPU)."""
        info = self.info(name)
        handle = self._handles.get(info.file)
        if handle is None:
            try:
                handle = safe_open(str(info.file), framework="pt", device="cpu")
            except Exception as err:  # the Rust library raises its own types
                raise QuantrollError(f"cannot open {info.file}: {err}") from None
            self._handles[info.file] = handle
        return handle.get_tensor(name)

    def iter_tensors(self, names: Iterable[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) one at a time, in file order unless ``names`` gives an order."""
        for name in self.tensors if names is None else names:
            yield name, self.load(name)

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CheckpointReader({str(self.path)!r}, {len(self.tensors)} tensors in {len(self.shards)} file(s))"

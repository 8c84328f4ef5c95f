"""One JSON line per step, flushed and fsynced at once: a crash loses nothing."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def _clean(value):
    """NaN/Inf as the strings "nan"/"inf" (strict JSON has neither), in nested dicts too."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class JsonlSink:
    def __init__(self, path: str | Path | None, append: bool = False):
        self.path = Path(path) if path else None
        self._f = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a" if append else "w")

    def write(self, record: dict) -> None:
        if self._f is None:
            return
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()

"""One JSON line per step, flushed and fsynced at once: a crash loses nothing.

The file is opened at the first line, not before: a run that fails before its first
step leaves no empty metrics file behind. A line that cannot be written whole (a full
disk) is cut off again, so the file never ends in half a record.
"""

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
        self.append = append
        self._f = None
        self._created = False

    def _open(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._created = not self.path.exists()
        self._f = open(self.path, "a" if self.append else "w")
        return self._f

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        f = self._f or self._open()
        line = json.dumps({k: _clean(v) for k, v in record.items()}) + "\n"
        start = f.tell()
        try:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        except OSError:
            self._cut(start)
            raise

    def _cut(self, size: int) -> None:
        """Drop what a failed write left after ``size`` bytes (best effort)."""
        try:
            self._f.close()
        except OSError:
            pass
        self._f = None
        self.append = True
        try:
            if size == 0 and self._created:
                self.path.unlink()  # it held nothing before this run: leave no empty file
            else:
                os.truncate(self.path, size)
        except OSError:
            pass

    def close(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None

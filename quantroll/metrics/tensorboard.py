"""``--tensorboard-dir``: the same scalars as the metrics JSONL, one event per step.

TensorBoard is optional (``pip install tensorboard``); asking for it without the
package is refused up front rather than discovered after the first step.
"""

from __future__ import annotations

from quantroll.errors import QuantrollError


class TensorBoardSink:
    """The writer (and its directory) is created at the first step, so that a run that
    fails before it leaves no empty event directory behind."""

    def __init__(self, directory: str | None):
        self.writer = None
        self.directory = directory
        self._make = None
        if directory:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise QuantrollError("--tensorboard-dir needs the tensorboard package: pip install tensorboard") from None
            self._make = SummaryWriter

    def write(self, record: dict) -> None:
        if self._make is None:
            return
        if self.writer is None:
            self.writer = self._make(log_dir=self.directory)
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

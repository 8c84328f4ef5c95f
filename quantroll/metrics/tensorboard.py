"""``--tensorboard-dir``: the same scalars as the metrics JSONL, one event per step.

TensorBoard is optional (``pip install tensorboard``); asking for it without the
package is refused up front rather than discovered after the first step.
"""

from __future__ import annotations

from quantroll.errors import QuantrollError


class TensorBoardSink:
    def __init__(self, directory: str | None):
        self.writer = None
        if directory:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise QuantrollError("--tensorboard-dir needs the tensorboard package: pip install tensorboard") from None
            self.writer = SummaryWriter(log_dir=directory)

    def write(self, record: dict) -> None:
        if self.writer is None:
            return
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

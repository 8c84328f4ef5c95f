"""A trainer process and an engine process on one device: the weight update through
shared memory instead of a collective.

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so two processes that share
a GPU cannot broadcast to each other. They can share memory: the trainer hands the engine
its BF16 parameters once (CUDA IPC handles on a GPU, shared memory on a CPU: what
torch.multiprocessing does when a tensor goes through its pipes), and every update after
that is a message. The engine's process quantizes straight from the trainer's tensors
into its own buffers with the one-process sync (WeightSync: the checkpoint's rules, the
direct one-graph path on a GPU), so no byte is copied between the processes and the
engine ends bitwise equal to an engine updated in the trainer's own process.

The two sides take turns: the trainer steps its optimizer in place (the parameters keep
their storage), waits for its GPU work, then ``publish`` sends the version and waits for
the engine's answer, so the engine never reads a half-written weight and the trainer
never writes one the engine is reading. A failure on the engine's side (a NaN/Inf
weight, a shape that does not fit) comes back as the answer and is raised in the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from quantroll.errors import QuantrollError

UPDATE, STOP = "update", "stop"


def _share(named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors as the pipe carries them: CPU storage moved into shared memory (in place,
    so the trainer keeps writing where the engine reads); CUDA tensors go as IPC handles."""
    out = {}
    for name, t in named.items():
        t = t.detach()
        if t.device.type == "cpu":
            t.share_memory_()
        out[name] = t
    return out


class SharedWeightsSender:
    """The trainer's side. ``named``: the parameters the engine loads from (their storage
    must stay put: an optimizer updating in place keeps it); ``conn``: one end of a
    ``torch.multiprocessing`` pipe whose other end a ``SharedWeightsReceiver`` holds."""

    def __init__(self, named: Mapping[str, torch.Tensor], conn):
        self.named = _share(named)
        self.conn = conn
        conn.send(self.named)
        self._answer("the engine's process did not map the trainer's weights")

    def _answer(self, what: str) -> dict:
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            raise QuantrollError(f"{what}: it exited") from None
        if kind == "error":
            raise QuantrollError(f"the engine's process: {payload}")
        return payload

    def publish(self, version: int) -> dict[str, float]:
        """The trainer's weights are final for ``version``: the engine loads them; returns its
        update's metrics (weight_quantize_time, weight_load_time, weight_copy_time, ...)."""
        for t in self.named.values():
            if t.device.type == "cuda":  # the optimizer's writes, done before the engine's reads
                torch.cuda.synchronize(t.device)
                break
        self.conn.send((UPDATE, version))
        return self._answer(f"update {version} was not loaded")

    def close(self) -> None:
        self.conn.send((STOP, None))


class SharedWeightsReceiver:
    """The engine's side: maps the trainer's tensors once, then loads each published update."""

    def __init__(self, engine, conn, direct: bool = True):
        from quantroll.sync.weight_sync import WeightSync

        self.engine, self.conn = engine, conn
        self.named = conn.recv()
        # every weight the engine holds, by the trainer's names (a quantized one's scales are
        # made from its weight): a tensor left out would stay stale without any error
        expected = {k for k in engine.state() if not k.endswith((".weight_scale", ".weight_global"))}
        missing, extra = sorted(expected - set(self.named)), sorted(set(self.named) - expected)
        if missing or extra:
            message = (f"the trainer's weights do not match the engine's: "
                       f"{f'the trainer lacks {missing[0]}' if missing else f'the engine has no {extra[0]}'}")
            conn.send(("error", message))
            raise QuantrollError(message)
        self.sync = WeightSync(engine, direct=direct)
        conn.send(("ok", {}))

    def serve(self) -> int:
        """Load every update until the trainer closes; returns how many were loaded."""
        loaded = 0
        while True:
            kind, version = self.conn.recv()
            if kind == STOP:
                return loaded
            try:
                timing = self.sync.push(self.named)
            except Exception as err:  # noqa: BLE001 - answered to the trainer, which raises it
                self.conn.send(("error", f"{type(err).__name__}: {err}"))
                raise
            loaded += 1
            self.conn.send(("ok", {**timing.metrics(), "trainer_version": version}))

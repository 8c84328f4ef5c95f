"""Which rank died: heartbeats in the launcher's key-value store.

When a rank dies (killed, out of memory, a crash), the others learn it from a collective
that fails ("connection reset by peer" under gloo, an NCCL error) without learning who.
So every rank bumps a counter ``quantroll/heartbeat/<rank>`` in the rendezvous store
every ``INTERVAL`` seconds from a daemon thread; a rank whose collective failed reads the
counters twice, ``2 * INTERVAL`` apart, and the ranks whose counter did not move are the
dead ones. The store outlives a worker: torchrun's agent hosts it, and quantroll's Ray
launcher hosts it in the driver.
"""

from __future__ import annotations

import signal
import threading
import time

INTERVAL = 0.5
KEY = "quantroll/heartbeat/{}"


class Stopped(BaseException):
    """The launcher asked this rank to stop (SIGTERM): torchrun's agent does so to every
    survivor as soon as one rank dies, often before the survivor's next collective could
    fail. Raised from the signal handler, so the survivor can still say who died (the
    agent waits before it kills)."""


def stop_on_sigterm() -> None:
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: the line is being written
        raise Stopped()

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (a Ray actor's): the actor's death is reported by Ray
        pass


class Heartbeat:
    def __init__(self, store, rank: int, interval: float = INTERVAL):
        self.store, self.rank, self.interval = store, rank, interval
        self._stop = threading.Event()
        self._beats = 0
        self.store.set(KEY.format(rank), "0")
        self._thread = threading.Thread(target=self._run, name=f"quantroll-heartbeat-{rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._beats += 1
            try:
                self.store.set(KEY.format(self.rank), str(self._beats))
            except Exception:  # noqa: BLE001 - the store is gone: the run is ending anyway
                return

    def stop(self) -> None:
        self._stop.set()


def _read(store, world: int) -> dict[int, str | None]:
    out = {}
    for rank in range(world):
        try:
            out[rank] = store.get(KEY.format(rank)).decode() if store.check([KEY.format(rank)]) else None
        except Exception:  # noqa: BLE001 - an unreachable store says nothing about the rank
            out[rank] = None
    return out


def dead_ranks(store, world: int, me: int, interval: float = INTERVAL) -> list[int] | None:
    """The ranks whose heartbeat stopped (never this one); None if the store cannot be read."""
    try:
        before = _read(store, world)
        time.sleep(2 * interval + 0.2)
        after = _read(store, world)
    except Exception:  # noqa: BLE001
        return None
    if all(v is None for v in after.values()):
        return None
    return [r for r in range(world) if r != me and (after[r] is None or after[r] == before[r])]


def describe_failure(store, world: int, me: int, stage: str) -> str:
    """The one line a surviving rank says when a collective failed during ``stage``."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's stop must not cut the line short
    except ValueError:
        pass
    dead = dead_ranks(store, world, me)
    if dead is None:
        who = "a peer stopped answering (the rendezvous store is gone too)"
    elif not dead:
        who = "a collective failed while every rank's heartbeat is alive (a rank hangs or the network failed)"
    else:
        who = f"rank{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} died (no heartbeat)"
    return f"{who}, seen by rank {me} during {stage}"

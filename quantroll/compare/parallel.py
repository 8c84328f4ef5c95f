"""Several runs of a compare at once (``compare --jobs N``): the placement of each run on a
GPU, and the pool that runs them.

Why: a study's runs are independent processes, and a small model leaves most of a GPU idle
(a decode step of a 7M-parameter model is launch- and host-bound), so N runs on one GPU
finish sooner than N in a row; on a node with several GPUs each run gets one of its own.
A run keeps every guarantee of a run alone (its own process, directory, log, resume), and
its record says whether it shared its GPU, since then its times include the others' work
and are not speed figures (the report warns).

The pool holds ``jobs`` slots, slot k on GPU ``gpus[k % len(gpus)]`` (the child sees only
that GPU: CUDA_VISIBLE_DEVICES). Interrupting the compare (Ctrl-C, SIGTERM) stops every
running child: each run is marked interrupted and resumes from its last save next time.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass

from quantroll.compare.runstatus import terminate_as_interrupt
from quantroll.errors import QuantrollError


@dataclass(frozen=True)
class Placement:
    """Where a compare's runs go: ``jobs`` at once, over ``gpus`` (the ids the parent sees
    as CUDA_VISIBLE_DEVICES names them; empty on a CPU, where the runs share the cores)."""

    jobs: int = 1
    gpus: tuple[str, ...] = ()
    pinned: bool = False  # the GPUs were named (--gpus): a run alone is placed on them too

    def __post_init__(self):
        if self.jobs < 1:
            raise QuantrollError(f"--jobs must be >= 1, got {self.jobs}")

    @property
    def shares_device(self) -> bool:
        """Whether two runs can run on one device at the same time."""
        return self.jobs > max(len(self.gpus), 1)

    def gpu(self, slot: int) -> str | None:
        """The GPU a run in ``slot`` is given (None: it sees what the compare sees)."""
        return self.gpus[slot % len(self.gpus)] if self.gpus and (self.jobs > 1 or self.pinned) else None

    def env(self, slot: int) -> dict[str, str]:
        """The environment a run in ``slot`` adds to the compare's (one GPU, on a GPU machine)."""
        gpu = self.gpu(slot)
        return {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}

    def record(self, slot: int) -> dict:
        """What a run's record keeps of its placement (runner.run_one's run.json)."""
        return {"jobs": self.jobs, "gpu": self.gpu(slot), "shared_device": self.shares_device}


def visible_gpus(device: str, cuda_count: int, environ=None) -> tuple[str, ...]:
    """The GPU ids a child can be given: CUDA_VISIBLE_DEVICES' entries where it is set (a
    child's ids are the parent's names, not its indices), else 0..count-1; none on a CPU."""
    if not str(device).startswith("cuda") or cuda_count < 1:
        return ()
    listed = (environ if environ is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return tuple(x.strip() for x in listed.split(",") if x.strip())[:cuda_count]
    return tuple(str(i) for i in range(cuda_count))


def check_shared_pools(placement: Placement, device: str, train_args: tuple[str, ...]) -> None:
    """Runs that share a GPU must each be given their KV pool: the engine's default (85% of
    the memory free when it allocates) would leave the next run none."""
    if str(device).startswith("cuda") and placement.shares_device \
            and not any(a.split("=")[0] == "--kv-cache-memory-gb" for a in train_args):
        raise QuantrollError(f"--jobs {placement.jobs} on {max(len(placement.gpus), 1)} GPU(s) puts several runs on "
                             "one GPU: give each run's KV pool in --train-args (e.g. \"--kv-cache-memory-gb 8\")")


def placement_for(device: str, jobs: int, gpus: str | None, train_args: tuple[str, ...], cuda_count: int,
                  environ=None) -> Placement:
    """compare's --jobs over --gpus (None: every visible GPU), checked before any run."""
    visible = visible_gpus(device, cuda_count, environ)
    if gpus is not None:
        if not str(device).startswith("cuda"):
            raise QuantrollError(f"--gpus places runs on GPUs; --device is {device}")
        named = tuple(x.strip() for x in gpus.split(",") if x.strip())
        unknown = [g for g in named if g not in visible]
        if not named or unknown:
            raise QuantrollError(f"--gpus {gpus}: {', '.join(unknown) or 'none given'} not among the visible GPUs "
                                 f"({', '.join(visible) or 'none'})")
        visible = named
    placement = Placement(jobs, visible, pinned=gpus is not None)
    check_shared_pools(placement, device, train_args)
    return placement


def run_all(items: list, run, placement: Placement) -> list:
    """``run(item, slot, stop)`` for every item, ``placement.jobs`` at a time; the results in
    the items' order. ``stop`` (a threading.Event) is set when the caller is interrupted or
    a run raises, or SIGTERM comes (it interrupts as Ctrl-C does: the runs' threads cannot
    take signals): each running ``run`` must then stop its child and raise. The first
    exception (KeyboardInterrupt included) is raised after every running item returned."""
    if placement.jobs == 1:
        return [run(item, 0, None) for item in items]
    stop = threading.Event()
    slots: queue.Queue[int] = queue.Queue()
    for k in range(placement.jobs):
        slots.put(k)

    def one(item):
        slot = slots.get()
        try:
            if stop.is_set():
                raise KeyboardInterrupt  # stopped before it started: nothing to mark
            return run(item, slot, stop)
        finally:
            slots.put(slot)

    with terminate_as_interrupt(), \
            ThreadPoolExecutor(max_workers=placement.jobs, thread_name_prefix="compare-run") as pool:
        futures = [pool.submit(one, item) for item in items]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f in done and f.exception() is not None), None)
            if failed is not None:
                raise failed.exception()
        except BaseException:
            stop.set()
            for f in futures:
                f.cancel()
            wait(futures)
            raise
    return [f.result() for f in futures]

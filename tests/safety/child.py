"""A ``quantroll`` command run in a forked child (multiprocessing's forkserver, which has
torch and quantroll imported once), its output in a log file: the kill loop starts
dozens of trainings, and a fresh interpreter would spend seconds importing each."""

from __future__ import annotations

import multiprocessing
import os
import sys

PRELOAD = ["torch", "torch._dynamo", "safetensors.torch", "tokenizers", "quantroll.cli", "quantroll.rl.loop",
           "quantroll.commands.train", "tests.safety.child"]


def forkserver():
    """The multiprocessing context whose server has imported torch and quantroll once
    (the server is one per test process: every test that uses it preloads the same)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run(argv: list[str], log: str, err_log: str | None = None) -> None:
    """``quantroll ARGV`` with stdout (and stderr, unless ``err_log``) into ``log``."""
    for target, streams in ((log, (1,) if err_log else (1, 2)), (err_log, (2,))):
        if target:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for stream in streams:
                os.dup2(fd, stream)
            os.close(fd)
    import torch

    torch.set_num_threads(1)  # two cores shared with the test runner: no thread contention
    from quantroll.cli import main

    sys.exit(main(argv))


def tiny_trainer(seed: int):
    """A small model and its optimizer after one update (so AdamW has moments), seeded."""
    import random

    import torch

    from quantroll.trainer.optimizer import MasterWeightAdamW

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    optimizer = MasterWeightAdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 8)).square().sum().backward()
    optimizer.step()
    return model, optimizer, random.Random(seed)


_HOOKED = ("mkdir", "rename", "replace", "unlink", "rmdir", "fsync", "chmod")


def save_stopping_at(directory: str, step: int, stop_at: int, count_file: str) -> None:
    """Save the state of ``tiny_trainer(step)`` as ``step``, ending the process at once
    (``os._exit``: no cleanup, as ``kill -9``) at the ``stop_at``-th filesystem
    operation; with no stop, the number of operations is written to ``count_file``."""
    import builtins
    import io

    import torch

    torch.set_num_threads(1)
    from quantroll.rl.state import save_state

    model, optimizer, rng = tiny_trainer(step)
    count = [0]

    def hooked(real):
        def call(*args, **kwargs):
            if count[0] == stop_at:
                os._exit(0)
            count[0] += 1
            return real(*args, **kwargs)
        return call

    real_open = builtins.open

    def opening(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            return hooked(real_open)(file, mode, *args, **kwargs)
        return real_open(file, mode, *args, **kwargs)

    originals = {name: getattr(os, name) for name in _HOOKED}
    for name, real in originals.items():
        setattr(os, name, hooked(real))
    builtins.open = io.open = opening
    save_state(directory, model, optimizer, step, rng)
    for name, real in originals.items():
        setattr(os, name, real)
    builtins.open = io.open = real_open
    with open(count_file, "w") as f:
        f.write(str(count[0]))
    os._exit(0)

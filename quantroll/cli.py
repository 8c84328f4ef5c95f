"""``quantroll`` command line: one subcommand per verb, each in quantroll/commands/.

Every subcommand module defines ``register(subparsers)``, which adds its parser and
sets ``func`` to the function that runs it. User errors end in one line on stderr and
exit status 2: a QuantrollError, a flag argparse refuses, and an OSError that escaped
its writer (a full disk, a read-only filesystem: the file and what to do). Ctrl-C, at
any moment from the first import on, exits 130 with one line. Anything else is a bug
in quantroll and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys

from quantroll.version import __version__
from quantroll.errors import QuantrollError

SEED_LIMIT = 2**64


class UsageError(QuantrollError):
    """A command line argparse refuses; ``prog`` is the (sub)command it belongs to."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse, but a refused command line is one line (with where to read more),
    raised instead of printed with the whole usage text."""

    def error(self, message: str):
        raise UsageError(self.prog, f"{message} (see {self.prog} --help)")

# Subcommand modules, in the order `quantroll --help` lists them.
COMMANDS = ("compare", "train", "attribute", "demo", "sft", "convert", "inspect", "generate", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="quantroll",
        description="RL post-training with low-precision rollout (block FP8, MXFP8, NVFP4) and BF16 training.",
    )
    parser.add_argument("--version", action="version", version=f"quantroll {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"quantroll.commands.{name}").register(sub)
    return parser


def use_device(device: str | None) -> None:
    """Make a ``--device cuda:N`` the process's current CUDA device: the Triton kernels
    launch on the current device, whatever device their tensors are on. An index the
    machine does not have is a user error."""
    if not device:
        return
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise QuantrollError(f"--device {device}: not a device name ({err})") from None
    if dev.type != "cuda":
        return
    count = torch.cuda.device_count()
    if not count:
        raise QuantrollError(f"--device {device}: this machine has no CUDA device; use --device cpu")
    if dev.index is None:
        return
    if dev.index >= count:
        raise QuantrollError(f"--device {device}: this machine has {count} CUDA device(s); pick cuda:0 .. "
                             f"cuda:{count - 1}")
    torch.cuda.set_device(dev.index)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    name = "quantroll"
    try:
        with _ctrl_c_held():
            import numpy  # noqa: F401
            import torch  # noqa: F401

            parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        name = f"quantroll {args.command}"
        if extra:  # said by the subcommand's name, not the top-level parser's
            raise UsageError(name, f"unrecognized arguments: {' '.join(extra)} (see {name} --help)")
        seed = getattr(args, "seed", None)
        if isinstance(seed, int) and seed >= SEED_LIMIT:  # torch's generators take 64-bit seeds, every command's
            raise UsageError(name, f"--seed must be below 2^64, got {seed}")
        use_device(getattr(args, "device", None))
        result = args.func(args)
    except KeyboardInterrupt as err:
        _interrupted(name, getattr(err, "hint", ""))
        return 130
    except UsageError as err:
        print(f"{err.prog}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except QuantrollError as err:
        if not getattr(err, "quiet", False):  # quiet: another rank of the same run says it
            print(f"{name}: error: {_one_line(err)}", file=sys.stderr)
        return getattr(err, "exit_code", 2)
    except OSError as err:  # a write that failed outside any writer that names its output
        from quantroll.durable import describe

        print(f"{name}: error: {_one_line(describe(err))}", file=sys.stderr)
        return 2
    return int(result or 0)


@contextlib.contextmanager
def _ctrl_c_held():
    """Hold Ctrl-C off while the C extensions load, and raise it once they have.

    An interrupt raised inside an extension's initialisation does not surface as
    KeyboardInterrupt: numpy imported from torch's C code clears it (torch then runs on
    without numpy), and torch's own pybind11 submodules turn it into an unrelated
    ``TypeError: expected a message argument`` (seen from ``torch._C._nvtx``). So the
    handler only records the signal; the imports take a few seconds at most."""
    received: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main thread: signals are not ours to set
        yield
        return
    try:
        yield
    finally:  # None: the previous handler was not set from Python; restore Python's own
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    if received:
        raise KeyboardInterrupt


def _interrupted(name: str, hint: str = "") -> None:
    """The one line for Ctrl-C, printed with Ctrl-C held off (a second one must not turn
    it into a traceback)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals are not ours to set
        previous = None
    print(f"{name}: interrupted{hint}", file=sys.stderr)
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def entry() -> None:
    """``python -m quantroll``: Ctrl-C before ``main`` runs its own handler (during the
    imports) is quiet too, and so is one after it returned (during interpreter exit)."""
    try:
        code = main()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        _interrupted("quantroll")
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    entry()

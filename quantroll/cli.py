"""``quantroll`` command line: one subcommand per verb, each in quantroll/commands/.

Every subcommand module defines ``register(subparsers)``, which adds its parser and
sets ``func`` to the function that runs it. User errors (QuantrollError) end in one
line on stderr and exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from quantroll import __version__
from quantroll.errors import QuantrollError

# Subcommand modules, in the order `quantroll --help` lists them.
COMMANDS = ("compare", "train", "demo", "sft", "convert", "inspect", "generate", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        use_device(getattr(args, "device", None))
        result = args.func(args)
    except QuantrollError as err:
        print(f"quantroll {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"quantroll {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

"""One weight update whose source refuses at its second unit (an injected error where a
real one would be a non-finite weight or a layout mismatch), on 2 trainer ranks and 1
engine rank: every rank must leave with the source's reason at once, not wait in the next
unit's collectives for a source that has left. ``mode``: "push" (an update) or "check"
(the first-update check's agreement around it). Prints one line per rank."""

from __future__ import annotations

import os
import sys

import torch

from quantroll.builtin import builtin_checkpoint
from quantroll.dist import weight_broadcast
from quantroll.dist.context import from_environ, init_process_group
from quantroll.dist.placement import Ranks
from quantroll.engine import Engine
from quantroll.errors import QuantrollError
from quantroll.trainer.policy import load_policy

_payload = weight_broadcast.BroadcastWeightSync._payload


def _say(line: str) -> None:
    """One line in one write(2): the ranks share the pipe, and print's separate write of the
    newline let another rank's line land in the middle (a flaky match)."""
    os.write(1, (line.replace("\n", " ") + "\n").encode())

def _refusing(self, index):
    if index == 1:
        raise QuantrollError("injected refusal at the source, unit 1")
    return _payload(self, index)


def main(mode: str) -> None:
    weight_broadcast.BroadcastWeightSync._payload = _refusing
    torch.set_num_threads(1)
    ctx = from_environ("cpu", 1)
    init_process_group(ctx)
    place = Ranks(ctx, bucket_bytes=64 * 1024)
    ckpt = builtin_checkpoint("dense")
    try:
        if place.groups.is_engine_rank:
            place.serve(Engine(ckpt, dtype=torch.float32))
        else:
            engine = Engine(ckpt, dtype=torch.float32)
            policy = load_policy(ckpt, device="cpu", dtype=torch.float32)
            place.shard(policy)
            push = place.sync(engine, policy)
            try:
                place.check_weight_update(engine, push, allow_quant_error=False) if mode == "check" else push()
            except BaseException as err:
                place.release_engines(err)
                raise
            place.release_engines(None)
        _say(f"rank {ctx.rank}: finished")
    except Exception as err:  # noqa: BLE001 - the line the test reads
        _say(f"rank {ctx.rank}: {type(err).__name__}: {err}")
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])

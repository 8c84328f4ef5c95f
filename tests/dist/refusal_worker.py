"""One weight update, on 2 trainer ranks and 1 engine rank, that is refused: by the source
while it quantizes its second unit (``where`` "source": an injected error), by the engine
rank while it loads its second bucket ("engine": an injected QuantrollError;
"engine-nonfinite": an injected NonFiniteError, which the agreement hands on under its own
type; "colocated": every rank a trainer and an engine, rank 1 refuses), because the engine
rank lays the update out differently from the source ("layout") or its engine lacks a
tensor the trainer sends ("missing": its layout cannot be built), or because the trainer's
final norm holds NaN ("nan": no injection, the source's own check). Every rank must leave
with the reason, naming the rank that refused, at once: not wait in the next unit's
collectives for a rank that has left. ``mode``: "push" (an update) or "check" (the
first-update check's agreement around it). Prints one line per rank."""

from __future__ import annotations

import os
import sys

import torch

from quantroll.builtin import builtin_checkpoint
from quantroll.distributed import weight_broadcast
from quantroll.distributed.context import from_environ, init_process_group
from quantroll.distributed.placement import Ranks
from quantroll.engine import Engine
from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.trainer.policy import load_policy

_payload = weight_broadcast.BroadcastWeightSync._payload
_load = weight_broadcast.BroadcastWeightSync._load
_groups = weight_broadcast.BroadcastWeightSync._groups
_loads_seen = []
_where = []


def _say(line: str) -> None:
    """One line in one write(2): the ranks share the pipe, and print's separate write of the
    newline let another rank's line land in the middle (a flaky match)."""
    os.write(1, (line.replace("\n", " ") + "\n").encode())

def _refusing(self, index):
    if index == 1:
        raise QuantrollError("injected refusal at the source, unit 1")
    return _payload(self, index)


def _refusing_load(self, data, bucket):
    _loads_seen.append(bucket)
    # the refusing rank's second bucket (buckets of 64 KiB: within the first units): the engine
    # rank (2), or, with every rank colocated, rank 1 alone
    refuser = 1 if _where == ["colocated"] else 2
    if int(os.environ["RANK"]) == refuser and len(_loads_seen) == 2:
        if _where == ["engine-nonfinite"]:
            raise NonFiniteError("injected non-finite load on an engine", tensor="model.layers.0.mlp.up_proj.weight")
        raise QuantrollError("injected load refusal on an engine")
    return _load(self, data, bucket)


def _misordered_groups(self, unit, state):
    groups = _groups(self, unit, state)
    if int(os.environ["RANK"]) == 2 and len(groups) > 1:  # the engine rank's layout: two tensors swapped
        groups[0], groups[1] = groups[1], groups[0]
    return groups


def main(mode: str, where: str) -> None:
    if where == "source":
        weight_broadcast.BroadcastWeightSync._payload = _refusing
    elif where == "layout":
        weight_broadcast.BroadcastWeightSync._groups = _misordered_groups
    elif where in ("engine", "engine-nonfinite", "colocated"):
        weight_broadcast.BroadcastWeightSync._load = _refusing_load
    torch.set_num_threads(1)
    _where.append(where)
    ctx = from_environ("cpu", 0 if where == "colocated" else 1)
    init_process_group(ctx)
    place = Ranks(ctx, bucket_bytes=64 * 1024)
    ckpt = builtin_checkpoint("dense")
    try:
        if place.groups.is_engine_rank:
            engine = Engine(ckpt, dtype=torch.float32)
            if where == "missing" and ctx.rank == 2:
                state = engine.state
                engine.state = lambda: {k: v for k, v in state().items() if k != "model.norm.weight"}
            place.serve(engine)
        else:
            engine = Engine(ckpt, dtype=torch.float32)
            policy = load_policy(ckpt, device="cpu", dtype=torch.float32)
            if where == "nan":
                with torch.no_grad():
                    policy.get_parameter("model.norm.weight")[3] = float("nan")
            place.shard(policy)
            try:  # as quantroll/rl/ranks.py: whatever fails on a trainer rank, rank 0 releases the engines
                push = place.sync(engine, policy)
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
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "source")

"""A trainer state saved by every rank of an FSDP2 run: one file per rank holding that
rank's shards, and ``state.json`` (written by rank 0) naming the files, their checksums
and, per tensor, its whole shape and whether it is sharded (along dim 0, as FSDP2 cuts
it: ``torch.chunk``, rank order, the last ranks possibly empty).

Why not gather: a whole save makes every rank hold every tensor at once, the policy's
BF16 weights, the FP32 masters and both AdamW moments (~14 bytes a parameter: ~112 GB
on each rank at 8B), which is what sharding the trainer exists to avoid. Here each rank
writes what it holds.

The protocol (every rank calls ``save``): rank 0 opens the new version (savedir) and
sends its path; every rank writes its file there and sends back its checksum (or its
error); rank 0 writes the record and makes the version current, then sends the outcome,
so that a failure anywhere is raised on every rank and ``LATEST`` still names the
previous state. A state saved by N ranks resumes on N (each rank reads its own file) or
on any other number (the shards are joined per tensor, then cut as the new run shards).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from quantroll.errors import QuantrollError
from quantroll.rl import savedir
from quantroll.rl.state_files import SHARDED, check, is_int, optimizer_tensors, read_tensors, write_record, \
    write_tensors


def shard_file(rank: int, world: int) -> str:
    return f"state-rank{rank:05d}-of-{world:05d}.safetensors"


def _is_sharded(t) -> bool:
    return hasattr(t, "to_local")  # FSDP2's DTensor


def local_tensors(policy, optimizer) -> tuple[dict[str, torch.Tensor], dict[str, dict], dict]:
    """(this rank's tensors, each one's whole shape and whether it is sharded, the
    optimizer record); no collective."""
    tensors, layout = {}, {}
    for name, v in policy.state_dict().items():
        sharded = _is_sharded(v)
        tensors[f"model.{name}"] = v.to_local() if sharded else v
        layout[f"model.{name}"] = {"shape": list(v.shape), "sharded": sharded}
    masters, inner = optimizer.export_local()
    opt, record = optimizer_tensors(masters, inner)
    for name, t in opt.items():
        p = optimizer.params[int(name.split(".")[1])]
        layout[name] = {"shape": list(p.shape) if t.dim() else [], "sharded": _is_sharded(p) and t.dim() > 0}
    return {**tensors, **opt}, layout, record


def save(directory: str | Path, policy, optimizer, step: int, rng: random.Random, config, ctx) -> None:
    import torch.distributed as dist

    from quantroll.distributed.collectives import broadcast_text

    tensors, layout, optimizer_record = local_tensors(policy, optimizer)
    mine = shard_file(ctx.rank, ctx.world_size)

    def write_mine(tmp: Path) -> str:
        try:
            return write_tensors(tmp / mine, tensors)
        except Exception as err:  # noqa: BLE001 - sent to rank 0, which raises it for every rank
            return f"error: rank {ctx.rank}: {type(err).__name__}: {err}"

    def checksums(own: str) -> list[str]:
        out: list = [None] * ctx.world_size
        dist.all_gather_object(out, own, group=ctx.group)  # the trainer ranks'
        return out

    if ctx.rank != 0:
        opened = broadcast_text(ctx, None)
        if opened.startswith("path:"):
            checksums(write_mine(Path(opened[len("path:"):])))
            opened = broadcast_text(ctx, None)
        if opened:
            raise QuantrollError(f"the save of step {step} failed on rank 0: {opened}")
        return

    def write(tmp: Path) -> None:
        broadcast_text(ctx, f"path:{tmp}")
        sums = checksums(write_mine(tmp))
        failed = [s for s in sums if s.startswith("error: ")]
        if failed:
            raise QuantrollError(failed[0][len("error: "):])
        shards = [{"file": shard_file(r, ctx.world_size), "sha256": s} for r, s in enumerate(sums)]
        write_record(tmp, SHARDED, step, rng, optimizer_record, config, world_size=ctx.world_size, shards=shards,
                     layout=layout)

    try:
        savedir.write_version(directory, step, write)
    except BaseException as err:
        broadcast_text(ctx, f"{type(err).__name__}: {err}")  # the answer in place of the path, or the outcome
        raise
    broadcast_text(ctx, "")  # done: LATEST names the new version


def _layout(record: dict, where: Path) -> dict[str, dict]:
    layout = record.get("layout")
    check(isinstance(layout, dict) and layout, where, "the tensor layout is missing")
    for name, entry in layout.items():
        check(isinstance(entry, dict) and isinstance(entry.get("sharded"), bool) and isinstance(entry.get("shape"), list)
              and all(is_int(d) and d >= 0 for d in entry["shape"]), where, f"the layout of {name} is malformed")
    return layout


def _files(record: dict, version: Path) -> list[tuple[Path, str]]:
    where = version / "state.json"
    world, shards = record.get("world_size"), record.get("shards")
    check(is_int(world) and world >= 1 and isinstance(shards, list) and len(shards) == world, where,
          "its shard list does not match its world size")
    out = []
    for rank, entry in enumerate(shards):
        check(isinstance(entry, dict) and entry.get("file") == shard_file(rank, world), where,
              f"shard {rank} is not named {shard_file(rank, world)}")
        out.append((version / entry["file"], entry.get("sha256")))
    return out


def read(version: Path, record: dict, optimizer) -> tuple[dict[str, torch.Tensor] | None, dict[str, tuple], bool]:
    """(tensors, every model tensor's whole shape, local). local: the run has the saved
    number of ranks and a sharded optimizer, and ``tensors`` are this rank's own shards;
    otherwise they are whole, joined from every rank's file."""
    where = version / "state.json"
    layout = _layout(record, where)
    files = _files(record, version)
    model_shapes = {k[len("model."):]: tuple(v["shape"]) for k, v in layout.items() if k.startswith("model.")}
    ctx = getattr(optimizer, "ctx", None)
    if ctx is not None and ctx.world_size == len(files):
        path, checksum = files[ctx.rank]
        tensors = read_tensors(path, checksum)
        check(set(tensors) == set(layout), path, "its tensors are not the ones the record lists")
        return tensors, model_shapes, True
    parts = [read_tensors(path, checksum) for path, checksum in files]
    whole = {}
    for name, entry in layout.items():
        check(all(name in p for p in parts), where, f"tensor {name} is missing from a shard")
        t = torch.cat([p[name] for p in parts], dim=0) if entry["sharded"] else parts[0][name]
        check(list(t.shape) == entry["shape"], where, f"the shards of {name} join to {list(t.shape)}, not "
              f"{entry['shape']}")
        whole[name] = t
    return whole, model_shapes, False

"""One rank of the multi-process tests: ``torchrun --nproc-per-node N -m tests.dist.worker
OUT_DIR FP8_DIR NVFP4_DIR [CASES [ENGINE_RANKS]]`` (or a Ray actor calling ``main``). Runs
every scenario of scenarios.py as a rank and writes, from rank 0, what the test compares
with one process: ``results.json`` and ``tensors.safetensors``. Every engine's state after
the weight update is summarized by a digest of its bytes, so the test sees all of them.

ENGINE_RANKS > 0: the last ENGINE_RANKS ranks hold engines of their own (as
``--rollout-num-gpus`` places them): the trainer ranks run the scenarios, the engine ranks
serve them (one serving loop per scenario that uses an engine), and the first engine rank
writes its engine's state after each update (``engine-tensors.safetensors``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from quantroll.distributed.collectives import all_gather_varlen, tensor_to_text, text_to_tensor
from quantroll.distributed.context import from_environ, init_process_group
from quantroll.distributed.placement import Ranks
from quantroll.engine import Engine
from tests.dist import scenarios

BUCKET = 64 * 1024  # small buckets: every layer's update spans several
SYNCS = (("fp8", True), ("nvfp4", False))  # (format, with the first-update check)


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _engine_digests(ctx, state: dict | None) -> list[str]:
    """The digest of every rank's engine that took the update, in rank order."""
    mine = digest(state) if state is not None else ""
    return [d for d in (tensor_to_text(t) for t in all_gather_varlen(ctx, text_to_tensor(mine))) if d]


def _serve(place, engine_dir: Path) -> dict[str, torch.Tensor]:
    """An engine rank's part of one scenario: serve it, then its engine's state."""
    engine = Engine(engine_dir, dtype=scenarios.DTYPE)
    place.serve(engine)
    return {n: t.cpu().clone() for n, t in engine.state().items()}


def main(out: str, fp8_dir: str, nvfp4_dir: str, cases: str = "", engine_ranks: str = "0") -> None:
    """``cases``: comma-separated TRAIN_CASES to run (all by default)."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    ctx = from_environ("cpu", int(engine_ranks))
    init_process_group(ctx)
    place = Ranks(ctx, bucket_bytes=BUCKET)
    engine_rank = place.groups.is_engine_rank
    dirs = {"fp8": Path(fp8_dir), "nvfp4": Path(nvfp4_dir)}
    results, tensors, served = {"world": ctx.world_size, "engine_ranks": ctx.engine_ranks}, {}, {}
    if not engine_rank:
        for name in cases.split(",") if cases else [c[0] for c in scenarios.TRAIN_CASES]:
            r = scenarios.train_case(place, name)
            results[f"train/{name}"] = {"losses": r["losses"], "grad_norms": r["grad_norms"]}
            tensors.update({f"train/{name}/master/{i}": m for i, m in enumerate(r["masters"])})
            tensors.update({f"train/{name}/weight/{n}": w for n, w in r["weights"].items()})
    if engine_rank:
        _serve(place, dirs["fp8"])
    else:
        results["generate"] = scenarios.generate_case(place, dirs["fp8"])
        place.release_engines(None)
    for label, check in SYNCS:
        state = None
        if engine_rank:
            state = _serve(place, dirs[label])
            if place.groups.engines.is_source:
                served.update({f"sync/{label}/{n}": t for n, t in state.items()})
        else:
            r = scenarios.sync_case(place, dirs[label], check)
            place.release_engines(None)
            results[f"sync/{label}"] = {"version": r["version"], "timing": r["timing"],
                                        "check_worst": r.get("check_worst")}
            if place.groups.colocated:
                state = r["state"]
                tensors.update({f"sync/{label}/{n}": t for n, t in state.items()})
        digests = _engine_digests(ctx, state)
        if ctx.is_source:
            results[f"sync/{label}"]["digests"] = digests
    Path(out).mkdir(parents=True, exist_ok=True)
    if served:
        save_file({k: v.contiguous() for k, v in served.items()}, str(Path(out) / "engine-tensors.safetensors"))
    if ctx.is_source:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(Path(out) / "tensors.safetensors"))
        (Path(out) / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:6])

"""One rank of the NCCL test (one GPU each): ``torchrun --nproc-per-node 2 -m
tests.dist.gpu_worker OUT FP8_DIR``. The broadcast weight sync on CUDA over NCCL, with the
first-update check; rank 0 writes its engine's state and every rank's digest."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from quantroll.distributed.collectives import all_gather_varlen, tensor_to_text, text_to_tensor
from quantroll.distributed.context import from_environ, init_process_group
from quantroll.distributed.placement import Ranks
from tests.dist import scenarios
from tests.dist.worker import BUCKET, digest


def main(out: str, fp8_dir: str) -> None:
    from safetensors.torch import save_file

    ctx = from_environ("cuda")
    init_process_group(ctx)
    place = Ranks(ctx, bucket_bytes=BUCKET)
    r = scenarios.sync_case(place, Path(fp8_dir), True, device=ctx.device, dtype=torch.bfloat16)
    digests = [tensor_to_text(t) for t in all_gather_varlen(ctx, text_to_tensor(digest(r["state"])))]
    if ctx.is_source:
        Path(out).mkdir(parents=True, exist_ok=True)
        save_file({f"sync/fp8/{k}": v.contiguous() for k, v in r["state"].items()}, str(Path(out) / "tensors.safetensors"))
        (Path(out) / "results.json").write_text(json.dumps({"world": ctx.world_size, "sync/fp8": {
            "digests": digests, "version": r["version"], "timing": r["timing"], "check_worst": r["check_worst"]}}))


if __name__ == "__main__":
    main(*sys.argv[1:3])

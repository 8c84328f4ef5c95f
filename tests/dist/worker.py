"""One rank of the multi-process tests: ``torchrun --nproc-per-node N -m tests.dist.worker
OUT_DIR FP8_DIR NVFP4_DIR [CASES]`` (or a Ray actor calling ``main``). Runs every scenario of
scenarios.py as a rank and writes, from rank 0, what the test compares with one process:
``results.json`` and ``tensors.safetensors``. Every rank's engine state after the weight
update is summarized by a digest of its bytes, so the test sees all of them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from quantroll.dist.collectives import all_gather_varlen, tensor_to_text, text_to_tensor
from quantroll.dist.context import from_environ, init_process_group
from quantroll.dist.placement import Ranks
from tests.dist import scenarios

BUCKET = 64 * 1024  # small buckets: every layer's update spans several


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main(out: str, fp8_dir: str, nvfp4_dir: str, cases: str = "") -> None:
    """``cases``: comma-separated TRAIN_CASES to run (all by default)."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    ctx = from_environ("cpu")
    init_process_group(ctx)
    place = Ranks(ctx, bucket_bytes=BUCKET)
    results, tensors = {"world": ctx.world_size}, {}
    for name in cases.split(",") if cases else [c[0] for c in scenarios.TRAIN_CASES]:
        r = scenarios.train_case(place, name)
        results[f"train/{name}"] = {"losses": r["losses"], "grad_norms": r["grad_norms"]}
        tensors.update({f"train/{name}/master/{i}": m for i, m in enumerate(r["masters"])})
        tensors.update({f"train/{name}/weight/{n}": w for n, w in r["weights"].items()})
    results["generate"] = scenarios.generate_case(place, Path(fp8_dir))
    for label, engine_dir, check in (("fp8", fp8_dir, True), ("nvfp4", nvfp4_dir, False)):
        r = scenarios.sync_case(place, Path(engine_dir), check)
        digests = [tensor_to_text(t) for t in all_gather_varlen(ctx, text_to_tensor(digest(r["state"])))]
        results[f"sync/{label}"] = {"digests": digests, "version": r["version"], "timing": r["timing"],
                                    "check_worst": r.get("check_worst")}
        tensors.update({f"sync/{label}/{n}": t for n, t in r["state"].items()})
    if ctx.is_source:
        Path(out).mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(Path(out) / "tensors.safetensors"))
        (Path(out) / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:5])

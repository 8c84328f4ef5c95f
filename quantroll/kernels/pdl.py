"""Programmatic dependent launch (PDL) for the decode step's Triton kernels.

Why: a decode step at batch 16 is ~10 kernels per layer, most of them a few microseconds
long, and each kernel's launch, ramp-up and tail leave the memory system idle. With PDL
(Hopper and newer) a kernel may be scheduled while the kernel before it still runs: its
programs start, do what does not depend on that kernel (a GEMM prefetches its first
weight bytes into L2) and then park at ``griddepcontrol.wait`` until it has finished and
its writes are visible. So the weight stream of the next GEMM overlaps the small kernels
in between.

The contract every kernel launched with ``launch_pdl`` keeps (``pdl_enter`` and the
GEMM's prologue implement it):
- every program executes ``griddepcontrol.wait`` before it reads anything an earlier
  kernel wrote and before it writes anything (no read of a buffer the previous kernel
  still writes, no write into memory it still reads); only immutable weights are read
  before the wait;
- every program waits before it finishes, so a kernel's completion implies its
  predecessors' (a plain kernel after a PDL chain sees all of it done);
- kernels with no prefetch release their successor at once (it parks too); a GEMM
  releases it only after its own wait, so at most one GEMM prefetches ahead of the
  kernel that runs.

``MODE`` is the switch (0 off, 1 small kernels release first, 2 every kernel waits
first; tests and the A/B bench set it); it takes effect for CUDA graphs captured after
the change.
"""

from __future__ import annotations

import os

import torch

MODE = 1


def use_pdl(device: torch.device) -> bool:
    """PDL for kernels launched on ``device``: CUDA, compute capability >= 9.0, not under
    Triton's CPU interpreter (which has no griddepcontrol)."""
    if not MODE or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_args(device: torch.device) -> dict:
    """Keyword arguments for a PDL-aware kernel launch: the launch attribute and the
    kernel's ``PDL`` constexpr, always together."""
    on = use_pdl(device)
    return {"launch_pdl": on, "PDL": MODE if on else 0}

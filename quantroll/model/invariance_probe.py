"""A startup check of what model/invariant.py takes from torch and the BLAS on trust.

The invariant ops rely on two properties of the machine they run on: torch's exp / log /
cos / sin give an element the same bits whatever its index in the tensor (torch's CPU loops
compute a tensor's tail with scalar code, and split large tensors across threads), and the
BLAS computes a row of a fixed-shape GEMM the same way at every row of the tile. Both hold
on the CPUs this was built on; where one does not, ``--true-on-policy-mode`` is refused
with the op named, rather than run approximately.
"""

from __future__ import annotations

import torch

from quantroll.errors import QuantrollError
from quantroll.model.invariant import matmul

_ELEMENTWISE = {"exp": torch.exp, "log": lambda x: torch.log(x.abs() + 1e-3), "cos": torch.cos, "sin": torch.sin}
_LARGE = 3 * 32768 + 37  # beyond torch's parallel grain, with a ragged tail


def _elementwise_ok(fn, dtype, device, gen) -> bool:
    x = (torch.randn(_LARGE, generator=gen) * 8).to(dtype).to(device)
    whole = fn(x)
    if not torch.equal(fn(x[5:]), whole[5:]) or not torch.equal(fn(x[-40:]), whole[-40:]):
        return False
    singles = torch.cat([fn(x[i:i + 1]) for i in range(0, 64)])
    return torch.equal(singles, whole[:64])


def _gemm_ok(n: int, k: int, kernels, dtype, device, gen) -> bool:
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16).to(dtype).to(device)
    probe = torch.randn(k, generator=gen).to(dtype).to(device)
    rows = kernels.invariant_gemm.block_m if torch.device(device).type == "cuda" else kernels.gemm_rows
    results = []
    for place in sorted({0, 1, rows // 2, rows - 1, rows, 3 * rows - 1, 40 * rows + 3}):
        x = torch.randn(place + 1 + (place % 3), k, generator=gen).to(dtype).to(device)
        x[place] = probe
        results.append(matmul(x, w, kernels)[place])
    return all(torch.equal(r, results[0]) for r in results)


def _columns_ok(n: int, k: int, kernels, dtype, device, gen) -> bool:
    """A column's bits the same in its own GEMM and behind other columns in a fused one (the
    engine's q/k/v and gate/up against the trainer's parts)."""
    w = torch.randn(n, k, generator=gen).to(dtype).to(device)
    before = torch.randn(kernels.invariant_gemm.block_n, k, generator=gen).to(dtype).to(device)
    x = torch.randn(37, k, generator=gen).to(dtype).to(device)
    return torch.equal(matmul(x, torch.cat([before, w]), kernels)[:, before.shape[0]:], matmul(x, w, kernels))


def check_invariance(kernels, dtype: torch.dtype, device, shapes: list[tuple[int, int]],
                     fused_shapes: list[tuple[int, int]] = ()) -> None:
    """Raise QuantrollError naming the first op that is not invariant on this machine.
    ``kernels``: the KernelConfig whose invariant GEMM runs; ``shapes``: (N, K) of the
    model's linears (a few are probed); ``fused_shapes``: those of the projections the engine
    fuses while the trainer runs them apart (Engine.fused_projections), whose columns must
    not depend on their place."""
    gen = torch.Generator().manual_seed(1234)
    for name, fn in _ELEMENTWISE.items():
        if not _elementwise_ok(fn, torch.float32, device, gen):
            raise QuantrollError(f"--true-on-policy-mode cannot hold on this machine: torch.{name} gives an element "
                                 "different bits depending on its place in the tensor")
    for n, k in list(dict.fromkeys(shapes))[:8]:
        if not _gemm_ok(n, k, kernels, dtype, device, gen):
            raise QuantrollError(f"--true-on-policy-mode cannot hold on this machine: the invariant GEMM computes a "
                                 f"row of a {k} x {n} product differently depending on the rows beside it")
    for n, k in list(dict.fromkeys(fused_shapes))[:4]:
        if not _columns_ok(n, k, kernels, dtype, device, gen):
            raise QuantrollError(f"--true-on-policy-mode cannot hold on this machine: the invariant GEMM computes a "
                                 f"column of a {k} x {n} product differently inside a fused projection")

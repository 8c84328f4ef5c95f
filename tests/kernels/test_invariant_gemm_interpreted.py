"""The batch-invariant GEMM (kernels/invariant_gemm.py) on a CPU, under Triton's interpreter
(this file run as a script, float32 so the dots are exact enough to compare tightly): the
product against F.linear, and a row's result the same bits whatever rows share the call,
where the row sits in its tile, and how many tiles the call has (the decode step's few
rows against the trainer's many). The device runs it compiled (test_true_on_policy_gpu.py);
what the interpreter shows is the indexing and the fixed K order, not the GPU's bits."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from tests.interpreted import needs_triton, run_interpreted


@needs_triton
def test_invariant_gemm_under_the_interpreter():
    run_interpreted([__file__], "invariant gemm ok", timeout=600)


def check() -> None:
    from quantroll.kernels.invariant_gemm import InvariantGemmTiles, invariant_gemm

    tiles = InvariantGemmTiles(block_m=16, block_n=32, block_k=32)
    for n, k in ((96, 80), (40, 64)):  # K and N not multiples of the tile: masked tails
        w = torch.randn(n, k)
        x = torch.randn(70, k)
        full = invariant_gemm(x, w, tiles)
        assert full.shape == (70, n)
        assert torch.allclose(full, F.linear(x, w), atol=1e-4, rtol=1e-5)
        row = x[37:38]
        for rows in (row, x[30:40], torch.cat([torch.randn(5, k), row]), x):  # 1 row, another tile place, many tiles
            got = invariant_gemm(rows, w, tiles)
            place = next(i for i in range(rows.shape[0]) if torch.equal(rows[i], row[0]))
            assert torch.equal(got[place], full[37]), (n, k, rows.shape)
        batched = invariant_gemm(x.view(7, 10, k), w, tiles)  # leading dims flatten
        assert torch.equal(batched.view(70, n), full)


if __name__ == "__main__":
    torch.manual_seed(0)
    check()
    print("invariant gemm ok")
    sys.exit(0)

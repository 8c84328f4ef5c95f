"""The copy-and-flag kernels (kernels/copy_check.py) under Triton's CPU interpreter: every
destination bit-identical to its source, and exactly the sources holding NaN or Inf
flagged, over tensors that end inside a block, span several, or are empty, through the
one-launch path of the small tensors and the per-tensor one of the large, and again
through the small tensors' tables kept from the first call (as a captured graph reuses them)."""

import os
import sys

import torch

from tests.interpreted import needs_triton, run_interpreted


def check() -> None:
    from quantroll.kernels import copy_check

    gen = torch.Generator().manual_seed(0)
    sizes = (1, 7, copy_check.BLOCK, copy_check.BLOCK + 3, 3 * copy_check.BLOCK - 1, 0, copy_check.SMALL + 5)
    srcs = [(torch.randn(n, generator=gen) * 1e3).to(torch.bfloat16) for n in sizes]
    srcs[1][6] = float("nan")
    srcs[3][copy_check.BLOCK + 1] = float("-inf")
    srcs[4][0] = float("inf")
    srcs[4][5] = torch.finfo(torch.bfloat16).max  # the largest finite value is not flagged
    srcs[2][:] = -torch.finfo(torch.bfloat16).max
    srcs[6][-1] = float("nan")  # the large tensor's last element
    dsts = [torch.full_like(s, 7.0) for s in srcs]
    flags = torch.full((len(srcs),), 5, dtype=torch.int32)
    tables = copy_check.copy_and_flag(srcs, dsts, flags)
    assert tables is not None and tables.count == 5  # the five non-empty small ones share one launch
    for s, d in zip(srcs, dsts):
        assert torch.equal(s.view(torch.int16), d.view(torch.int16))
    assert flags.tolist() == [0, 1, 0, 1, 1, 0, 1], flags.tolist()
    for s in srcs:  # new values in the same storage, copied through the kept tables
        s.copy_(torch.randn(s.shape, generator=gen).to(torch.bfloat16))
    srcs[0][0] = float("inf")
    copy_check.copy_and_flag(srcs, dsts, flags, tables)
    for s, d in zip(srcs, dsts):
        assert torch.equal(s.view(torch.int16), d.view(torch.int16))
    assert flags.tolist() == [1, 0, 0, 0, 0, 0, 0], flags.tolist()
    # a strided destination: torch's copy and a separate check
    wide = torch.zeros(4, 6, dtype=torch.bfloat16)
    src = torch.ones(4, 3, dtype=torch.bfloat16)
    src[2, 1] = float("nan")
    one = torch.zeros(1, dtype=torch.int32)
    copy_check.copy_and_flag([src], [wide[:, ::2]], one)
    assert torch.equal(wide[:, ::2].view(torch.int16), src.view(torch.int16)) and one.item() == 1
    try:
        copy_check.copy_and_flag([src.float()], [torch.zeros(4, 3)], one)
    except ValueError as exc:
        assert "pair 0" in str(exc)
    else:
        raise AssertionError("a float32 source was taken")


@needs_triton
def test_copy_and_flag_under_interpreter():
    run_interpreted([__file__], "copy check ok", timeout=200)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    check()
    print("copy check ok")
    sys.exit(0)

"""Run the quantize kernels under TRITON_INTERPRET=1 on CPU tensors (a subprocess of
test_quantize_interpret.py): checks indexing, masking, packing and scales.

The interpreter's float32 -> e4m3 cast is not exact (it rounds ties away from zero and
drops the carry into the exponent: 127.7 becomes 64, not 128), so E4M3 codes may differ
from the reference by one code step, or be half of a power of two; everything computed
without that cast (FP8 and MXFP8 scales, NVFP4 global scale, E2M1 codes of groups whose
scale agrees, every shape and dtype) must match exactly.
"""

from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"

from quantroll.formats.elements import unpack_nibbles  # noqa: E402
from quantroll.kernels import QuantizePlan, quantize_weight_gpu, quantize_weights_gpu  # noqa: E402
from tests.kernels.cases import FORMATS, fmt_of, mixed_weight  # noqa: E402


def e4m3_close(ref: torch.Tensor, got: torch.Tensor) -> bool:
    """Equal, one code apart, or the interpreter's slip: a power of two that came out halved."""
    r = ref.contiguous().view(torch.uint8).to(torch.int32)
    g = got.contiguous().view(torch.uint8).to(torch.int32)
    same_sign = (r & 0x80) == (g & 0x80)
    rv, gv = ref.to(torch.float32), got.to(torch.float32)
    power_of_two = (rv != 0) & (torch.frexp(rv).mantissa.abs() == 0.5)
    slip = power_of_two & (gv * 2 == rv)
    return bool((same_sign & ((((r & 0x7F) - (g & 0x7F)).abs() <= 1) | slip)).all())


def check(w: torch.Tensor, spec, got=None) -> None:
    fmt = fmt_of(spec)
    ref = fmt.quantize_weight(w)
    got = quantize_weight_gpu(w, fmt, "w") if got is None else got
    assert (got.format, got.shape, got.block) == (ref.format, ref.shape, ref.block)
    assert got.data.shape == ref.data.shape and got.data.dtype == ref.data.dtype
    assert got.scale.shape == ref.scale.shape and got.scale.dtype == ref.scale.dtype
    if fmt.name == "nvfp4":
        assert torch.equal(got.global_scale.view(1).view(torch.int32), ref.global_scale.view(1).view(torch.int32))
        assert e4m3_close(ref.scale, got.scale), "nvfp4 scales"
        same = ref.scale.view(torch.uint8) == got.scale.view(torch.uint8)
        m = same.repeat_interleave(16, dim=1)[:, : w.shape[1]]
        rc, gc = unpack_nibbles(ref.data, w.shape[1]), unpack_nibbles(got.data, w.shape[1])
        assert torch.equal(rc[m], gc[m]), "nvfp4 codes where the group scale agrees"
        if w.shape[1] % 2:
            assert torch.equal(got.data[:, -1] >> 4, torch.zeros_like(got.data[:, -1])), "odd K pads a zero nibble"
    else:
        assert torch.equal(ref.scale.view(torch.uint8), got.scale.view(torch.uint8)), f"{fmt.name} scales"
        assert e4m3_close(ref.data, got.data), f"{fmt.name} codes"


def main() -> int:
    shapes = [(1, 1), (127, 129), (200, 300), (33, 17), (5, 1000), (300, 7), (130, 16)]
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    n = 0
    for spec in FORMATS:
        for shape in shapes:
            for dtype in dtypes:
                check(mixed_weight(shape, dtype, seed=n), spec)
                n += 1
        # many at once, a plan (eager on CPU), out= buffers
        ws = [mixed_weight(s, torch.bfloat16, seed=i) for i, s in enumerate([(64, 96), (40, 33)])]
        for w, got in zip(ws, quantize_weights_gpu(ws, fmt_of(spec), ["a", "b"])):
            check(w, spec, got)
        plan = QuantizePlan(ws, fmt_of(spec), ["a", "b"])
        ws[0].mul_(-3)
        for w, got in zip(ws, plan.run()):
            check(w, spec, got)
        n += 1
    print(f"interpreter: {n} cases ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

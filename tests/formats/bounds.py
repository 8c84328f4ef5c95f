"""The error bound every format promises, stated once for all the tests.

Each dequantized element lies within half an ULP (of its format, at the scale actually
stored) of the input. The scale and the quotient x/scale are float32 results, so a
quotient can land a float32 rounding step on the wrong side of a tie, and the
dequantizing product rounds once more: we allow 2**-22 of |x| on top of the half ULP
(2**-24 per float32 rounding, three roundings, plus margin). Power-of-two scales
(MXFP8) make the quotient exact, so there the slack is zero.
"""

from __future__ import annotations

import torch

FP32_SLACK = 2.0**-22


def assert_within_half_ulp(x: torch.Tensor, deq: torch.Tensor, ulp: torch.Tensor, slack: float = FP32_SLACK,
                           exempt: torch.Tensor | None = None) -> None:
    x64, d64, u64 = x.double(), deq.double(), ulp.double()
    err = (x64 - d64).abs()
    bound = 0.5 * u64 + slack * torch.maximum(x64.abs(), d64.abs())
    ok = err <= bound
    if exempt is not None:
        ok |= exempt
    if not bool(ok.all()):
        i = (~ok).nonzero()[0].tolist()
        raise AssertionError(
            f"{int((~ok).sum())} element(s) beyond half an ULP; first at {i}: x={x64[tuple(i)].item()!r} "
            f"deq={d64[tuple(i)].item()!r} ulp={u64[tuple(i)].item()!r}"
        )


def sqnr_db(x: torch.Tensor, deq: torch.Tensor) -> float:
    x64 = x.double()
    noise = (x64 - deq.double()).pow(2).sum()
    return float(10 * torch.log10(x64.pow(2).sum() / noise))

"""MXFP8 with both E8M0 scale rules, against hand-worked groups and exact bounds."""

import pytest
import torch

from quantroll.errors import QuantrollError
from quantroll.formats import get_format
from quantroll.formats.elements import e8m0_decode
from tests.formats.bounds import assert_within_half_ulp

CEIL, OCP = get_format("mxfp8"), get_format("mxfp8", scale_rule="ocp")


def group(amax: float, fill: float = 0.25) -> torch.Tensor:
    g = torch.full((1, 32), fill)
    g[0, 7] = amax
    return g


def test_default_rule_is_ceil():
    assert CEIL.scale_rule == "ceil"


@pytest.mark.parametrize(
    "amax, ceil_byte, ocp_byte",
    [
        (1.0, 119, 119),  # 2**0: ocp 0-8; ceil: 1/448 -> 2**-8.8 -> ceil -8
        (448.0, 127, 127),  # exactly 1.75 * 2**8: ceil needs no extra step
        (500.0, 128, 127),  # 1.95 * 2**8: ceil steps up, ocp saturates
        (2.0**-130, 0, 0),  # clamps at 2**-127
    ],
)
def test_scale_bytes_by_hand(amax, ceil_byte, ocp_byte):
    assert CEIL.quantize_weight(group(amax, 0.0)).scale.item() == ceil_byte
    assert OCP.quantize_weight(group(amax, 0.0)).scale.item() == ocp_byte


def test_ocp_saturates_and_ceil_does_not():
    w = group(500.0)
    qo, qc = OCP.quantize_weight(w), CEIL.quantize_weight(w)
    assert OCP.dequantize(qo)[0, 7].item() == 448.0  # saturated
    assert CEIL.dequantize(qc)[0, 7].item() == 512.0  # 250 rounds to 256 at scale 2
    assert CEIL.dequantize(qc)[0, 0].item() == 0.25  # 0.25 / 2 = 0.125 is exact in E4M3


def test_ceil_rule_keeps_small_elements_exact_by_hand():
    w = group(448.0, 0.25)
    q = CEIL.quantize_weight(w)
    assert CEIL.dequantize(q).tolist() == w.tolist()


def test_zero_group_exact_zeros():
    w = torch.zeros(3, 64)
    w[0, :32] = 1.0
    for fmt in (CEIL, OCP):
        q = fmt.quantize_weight(w)
        assert q.scale.dtype == torch.uint8 and q.scale.shape == (3, 2)
        assert q.scale[1, 0].item() == 0
        assert torch.equal(fmt.dequantize(q)[1:], torch.zeros(2, 64))


def test_half_ulp_exact_for_ceil_and_saturation_bounded_for_ocp():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 100, generator=g) * torch.logspace(-6, 4, 100)
    qc = CEIL.quantize_weight(w)
    assert_within_half_ulp(w, CEIL.dequantize(qc), CEIL.ulp(qc), slack=0.0)
    qo = OCP.quantize_weight(w)
    deq = OCP.dequantize(qo)
    step = e8m0_decode(qo.scale).repeat_interleave(32, dim=1)[:, :100]
    saturated = w.abs() > 448 * step
    assert saturated.any(), "the OCP rule must saturate some elements of Gaussian groups"
    assert_within_half_ulp(w, deq, OCP.ulp(qo), slack=0.0, exempt=saturated)
    # saturated elements: error is |x| - 448 * 2**s, below 64 * 2**s (amax < 512 * 2**s)
    err = (w - deq).abs()[saturated]
    assert torch.all(err == w.abs()[saturated] - 448 * step[saturated])
    assert torch.all(err < 64 * step[saturated])


def test_requantize_round_trip():
    g = torch.Generator().manual_seed(4)
    w = (torch.randn(32, 256, generator=g) * 3).to(torch.bfloat16)
    qo = OCP.quantize_weight(w)
    qo2 = OCP.quantize_weight(OCP.dequantize(qo))
    assert torch.equal(qo.data.view(torch.uint8), qo2.data.view(torch.uint8)) and torch.equal(qo.scale, qo2.scale)
    # ceil: a group whose amax mantissa lies in (1.75, 1.8125) dequantizes to max code 224,
    # which the rule then encodes one exponent lower with doubled codes: same values,
    # other bits. Values are a fixed point; bits are not.
    qc = CEIL.quantize_weight(w)
    deq = CEIL.dequantize(qc)
    assert torch.equal(CEIL.dequantize(CEIL.quantize_weight(deq)), deq)


def test_activation_groups_of_32():
    x = torch.randn(5, 70)
    q = CEIL.quantize_activation(x)
    assert q.scale.shape == (5, 3)
    assert_within_half_ulp(x, CEIL.dequantize(q), CEIL.ulp(q), slack=0.0)


def test_unknown_rule_refused():
    with pytest.raises(QuantrollError, match="scale rule"):
        get_format("mxfp8", scale_rule="round")
    with pytest.raises(QuantrollError, match="mxfp8 only"):
        get_format("fp8", scale_rule="ocp")

"""Element formats against the float64 table references and hand-worked values."""

import numpy as np
import pytest
import torch

from quantroll.formats import elements as el
from tests.formats.reference import E2M1, e4m3_values, round_to_table


def test_e4m3_table_matches_torch_decode():
    codes = torch.arange(0x7F, dtype=torch.uint8)
    decoded = codes.view(torch.float8_e4m3fn).to(torch.float64).numpy()
    np.testing.assert_array_equal(decoded, e4m3_values())
    assert e4m3_values().max() == 448.0


def test_to_e4m3_rounds_to_nearest_even_like_the_table():
    g = torch.Generator().manual_seed(0)
    table = e4m3_values()
    # random magnitudes over the whole range, plus every midpoint between neighbours (ties)
    x = torch.cat([
        torch.randn(20000, generator=g) * torch.exp2(torch.randint(-12, 10, (20000,), generator=g).float()),
        torch.tensor((table[1:] + table[:-1]) / 2, dtype=torch.float32),
        torch.tensor([448.0, 449.0, 463.9, 464.0, 1e6, -1e6]),
    ])
    got = el.to_e4m3(x).to(torch.float64).numpy()
    want, _ = round_to_table(x.double().numpy(), table)
    np.testing.assert_array_equal(got, want)


def test_e4m3_ulp_hand_values():
    v = torch.tensor([0.0, 2.0**-9, 2.0**-7, 2.0**-6, 1.0, 1.875, 2.0, 240.0, 256.0, 448.0, -448.0])
    want = torch.tensor([2.0**-9] * 4 + [0.125, 0.125, 0.25, 16.0, 32.0, 32.0, 32.0])
    assert torch.equal(el.e4m3_ulp(v), want)


def test_e4m3_ulp_is_spacing_to_next_value():
    table = e4m3_values()
    ulp = el.e4m3_ulp(torch.tensor(table[:-1], dtype=torch.float32)).double().numpy()
    np.testing.assert_array_equal(ulp, np.diff(table))


def test_e2m1_encode_matches_table_with_ties_and_saturation():
    g = torch.Generator().manual_seed(1)
    ties = (E2M1[1:] + E2M1[:-1]) / 2  # 0.25 0.75 1.25 1.75 2.5 3.5 5.0
    x = torch.cat([torch.randn(5000, generator=g) * 3, torch.tensor(np.concatenate([ties, -ties]), dtype=torch.float32),
                   torch.tensor([6.0, 6.5, 100.0, -100.0])])
    codes = el.e2m1_encode(x)
    want_vals, want_mag = round_to_table(x.double().numpy(), E2M1)
    assert torch.equal((codes & 7).long(), torch.tensor(want_mag))
    np.testing.assert_array_equal(el.e2m1_decode(codes).double().numpy(), want_vals)


def test_e2m1_ties_go_to_even_code_by_hand():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert el.e2m1_decode(el.e2m1_encode(x)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_e2m1_sign_follows_signbit():
    codes = el.e2m1_encode(torch.tensor([-0.0, -0.1, 0.0, -6.0]))
    assert codes.tolist() == [8, 8, 0, 15]


def test_pack_nibbles_low_is_even_element():
    codes = torch.tensor([[0x1, 0x2, 0x3, 0x4, 0xF]], dtype=torch.uint8)
    packed = el.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x0F]]
    assert torch.equal(el.unpack_nibbles(packed, 5), codes)


@pytest.mark.parametrize("e", [-127, -126, -1, 0, 1, 127])
def test_pow2_exact(e):
    assert el.pow2(torch.tensor([e])).double().item() == 2.0**e


def test_e8m0_round_trip_and_nan():
    exps = torch.arange(-127, 128)
    b = el.e8m0_encode(exps)
    assert b.tolist() == list(range(0, 255))
    assert torch.equal(el.e8m0_decode(b).double(), torch.tensor([2.0**e for e in range(-127, 128)], dtype=torch.float64))
    assert torch.isnan(el.e8m0_decode(torch.tensor([255], dtype=torch.uint8))).all()


def test_floor_log2_and_mantissa():
    x = torch.tensor([1.0, 1.75, 1.7500001, 448.0, 0.3])
    assert el.floor_log2(x).tolist() == [0, 0, 0, 8, -2]
    assert (el.mantissa_bits(x) > 0x600000).tolist() == [False, False, True, False, False]  # 0.3 = 1.2 * 2**-2


def test_div_exact_is_true_division():
    x = torch.rand(100000) * 1000
    want = (x.double() / 448.0).float()  # the correctly rounded quotient
    assert torch.equal(el.div_exact(x, 448.0), want)

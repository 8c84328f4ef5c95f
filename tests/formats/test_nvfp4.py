"""NVFP4 against hand-worked groups, the packed layout, and the half-ULP bound."""

import pytest
import torch

from quantroll.errors import QuantrollError
from quantroll.formats import get_format
from quantroll.formats.elements import e2m1_decode, unpack_nibbles
from tests.formats.bounds import assert_within_half_ulp, sqnr_db

NV = get_format("nvfp4")


def test_hand_worked_groups():
    # tensor amax 2688 makes global = 2688 / (448 * 6) = 1 exactly
    g0 = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.3, 0.0, 1.0, 0.5, 4.0, 3.0, 2.0]
    g1 = [2688.0] + [0.0] * 15
    w = torch.tensor([g0 + g1])
    q = NV.quantize_weight(w)
    assert q.global_scale.item() == 1.0
    # group 0: amax 6 -> scale e4m3(6 / 6 / 1) = 1; group 1: 2688 / 6 = 448
    assert q.scale.float().tolist() == [[1.0, 448.0]]
    codes = unpack_nibbles(q.data, 32)[0]
    assert codes[:16].tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 8, 9, 0, 2, 1, 6, 5, 4]
    assert codes[16].item() == 7
    assert q.data[0, 0].item() == 0x20  # element 0 (code 0) low, element 1 (code 2) high
    assert NV.dequantize(q)[0, :8].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]
    assert NV.dequantize(q)[0, 16].item() == 2688.0


def test_layout_shapes_and_dtypes_with_odd_k():
    w = torch.randn(7, 37)
    q = NV.quantize_weight(w)
    assert q.data.dtype == torch.uint8 and q.data.shape == (7, 19)
    assert q.scale.dtype == torch.float8_e4m3fn and q.scale.shape == (7, 3)
    assert q.global_scale.dtype == torch.float32 and q.global_scale.dim() == 0
    assert_within_half_ulp(w, NV.dequantize(q), NV.ulp(q))


def test_global_scale_formula():
    w = torch.randn(16, 64)
    q = NV.quantize_weight(w)
    assert q.global_scale.item() == pytest.approx(w.abs().max().item() / 2688, rel=1e-7)


def test_zero_groups_and_zero_tensor():
    w = torch.zeros(2, 32)
    w[0, :16] = torch.linspace(-1, 1, 16)
    q = NV.quantize_weight(w)
    assert q.scale[1, 0].float().item() == 0.0
    assert torch.equal(NV.dequantize(q)[1], torch.zeros(32))
    qz = NV.quantize_weight(torch.zeros(3, 16))
    assert qz.global_scale.item() == 1.0 and torch.equal(NV.dequantize(qz), torch.zeros(3, 16))


def test_tiny_group_scale_never_underflows_to_zero():
    w = torch.zeros(1, 32)
    w[0, 0] = 2688.0
    w[0, 16] = 1e-4  # 1e-4 / 6 / 1 underflows E4M3 (< 2**-10)
    q = NV.quantize_weight(w)
    assert q.scale[0, 1].float().item() == 2.0**-9
    assert_within_half_ulp(w, NV.dequantize(q), NV.ulp(q))


def test_random_weights_within_half_ulp_and_sqnr():
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(128, 256, generator=g) * 0.02).to(torch.bfloat16)
    q = NV.quantize_weight(w)
    deq = NV.dequantize(q)
    assert_within_half_ulp(w.float(), deq, NV.ulp(q))
    # E2M1 with a 16-element E4M3 scale: Gaussian data near 20 dB
    assert sqnr_db(w.float(), deq) > 18


def test_requantize_round_trip_codes_and_scales_bitwise_global_within_one_ulp():
    g = torch.Generator().manual_seed(6)
    for _ in range(20):
        w = (torch.randn(32, 128, generator=g) * 10 ** torch.empty(1).uniform_(-3, 3, generator=g)).to(torch.bfloat16)
        q = NV.quantize_weight(w)
        q2 = NV.quantize_weight(NV.dequantize(q))
        assert torch.equal(q.data, q2.data)
        assert torch.equal(q.scale.view(torch.uint8), q2.scale.view(torch.uint8))
        # amax(deq) = 6 * fl(448 * global) need not divide back to global exactly
        assert abs(q2.global_scale.item() - q.global_scale.item()) <= 2.0**-23 * q.global_scale.item()


def test_shared_global_amax_for_fused_shards():
    k = torch.randn(8, 32)
    v = torch.randn(8, 32) * 5
    shared = torch.maximum(k.abs().max(), v.abs().max())
    qk, qv = NV.quantize_weight(k, "k", global_amax=shared), NV.quantize_weight(v, "v", global_amax=shared)
    assert torch.equal(qk.global_scale, qv.global_scale)
    assert_within_half_ulp(k, NV.dequantize(qk), NV.ulp(qk))
    with pytest.raises(QuantrollError, match="below the tensor's own amax"):
        NV.quantize_weight(v, "v", global_amax=k.abs().max() / 10)


def test_activation_dynamic_global_and_groups():
    x = torch.randn(3, 4, 48)
    q = NV.quantize_activation(x)
    assert q.scale.shape == (3, 4, 3) and q.data.shape == (3, 4, 24)
    assert q.global_scale.item() == pytest.approx(x.abs().max().item() / 2688, rel=1e-7)
    assert_within_half_ulp(x, NV.dequantize(q), NV.ulp(q))


def test_decode_table_signs():
    assert e2m1_decode(torch.tensor([0, 7, 8, 15], dtype=torch.uint8)).tolist() == [0.0, 6.0, -0.0, -6.0]


def test_subnormal_amax_keeps_scales_finite():
    w = torch.tensor([[3e-42] + [1e-43] * 15])
    q = NV.quantize_weight(w)
    assert q.global_scale.item() > 0 and torch.isfinite(q.scale.float()).all()
    assert torch.isfinite(NV.dequantize(q)).all()

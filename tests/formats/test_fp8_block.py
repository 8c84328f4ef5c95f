"""Block-wise FP8 against hand-worked blocks and the half-ULP bound."""

import pytest
import torch

from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.formats import get_format
from tests.formats.bounds import assert_within_half_ulp, sqnr_db

FP8 = get_format("fp8")


def test_hand_worked_block():
    # amax 896 -> scale 2; 3/2 = 1.5 exact; -17/2 = -8.5 is a tie between 8 (even) and 9
    w = torch.tensor([[896.0, 3.0], [0.0, -17.0]])
    q = FP8.quantize_weight(w)
    assert q.scale.tolist() == [[2.0]]
    assert q.data.float().tolist() == [[448.0, 1.5], [0.0, -8.0]]
    assert FP8.dequantize(q).tolist() == [[896.0, 3.0], [0.0, -16.0]]
    assert FP8.ulp(q).tolist() == [[64.0, 0.25], [2.0**-8, 2.0]]


def test_partial_edge_blocks_take_scale_from_existing_part():
    w = torch.zeros(130, 257)
    w[0, 0] = 448.0  # block (0, 0)
    w[129, 129] = 4.48  # block (1, 1): only 2 rows exist
    w[5, 256] = -0.448  # block (0, 2): one column exists
    q = FP8.quantize_weight(w)
    assert q.scale.shape == (2, 3)
    assert q.scale[0, 0].item() == 1.0
    assert q.scale[1, 1].item() == pytest.approx(0.01, rel=1e-7)
    assert q.scale[0, 2].item() == pytest.approx(0.001, rel=1e-7)
    assert q.scale[1, 0].item() == 0.0 and q.scale[0, 1].item() == 0.0
    deq = FP8.dequantize(q)
    assert deq[129, 129].item() == pytest.approx(4.48, rel=1e-6)


def test_all_zero_blocks_give_exact_zeros_not_nan():
    w = torch.zeros(256, 256, dtype=torch.bfloat16)
    w[:128, :128] = torch.randn(128, 128, dtype=torch.bfloat16)
    q = FP8.quantize_weight(w)
    deq = FP8.dequantize(q)
    assert not torch.isnan(deq).any()
    assert (deq[128:, :] == 0).all() and (deq[:, 128:] == 0).all()
    assert q.scale[1, 1].item() == 0.0


def test_random_bf16_weight_within_half_ulp_and_sqnr():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(384, 200, generator=g) * 0.02).to(torch.bfloat16)
    q = FP8.quantize_weight(w)
    assert q.data.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float32
    assert q.scale.shape == (3, 2)
    deq = FP8.dequantize(q)
    assert_within_half_ulp(w.float(), deq, FP8.ulp(q))
    # E4M3 has 3 mantissa bits: Gaussian data lands near 30 dB
    assert sqnr_db(w.float(), deq) > 28


def test_activation_groups_are_per_token_1x128():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 300, generator=g)
    x[0, 1, 128:256] *= 1000  # one group of one token far larger: others unaffected
    q = FP8.quantize_activation(x)
    assert q.scale.shape == (2, 3, 3) and q.data.shape == x.shape
    for t in range(3):
        for grp, (lo, hi) in enumerate([(0, 128), (128, 256), (256, 300)]):
            assert q.scale[0, t, grp].item() == pytest.approx(x[0, t, lo:hi].abs().max().item() / 448, rel=1e-7)
    assert_within_half_ulp(x, FP8.dequantize(q), FP8.ulp(q))


def test_requantizing_bf16_dequantized_values_is_bitwise_identity():
    # exhaustively true for bf16 amaxes: fl(fl(448 * fl(a/448)) / 448) == fl(a/448)
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(256, 384, generator=g) * torch.logspace(-4, 2, 384)).to(torch.bfloat16)
    q = FP8.quantize_weight(w)
    q2 = FP8.quantize_weight(FP8.dequantize(q))
    assert torch.equal(q.data.view(torch.uint8), q2.data.view(torch.uint8))
    assert torch.equal(q.scale, q2.scale)


def test_saturation_never_exceeds_448():
    w = torch.tensor([[1e30, -1e30, 1.0]])
    q = FP8.quantize_weight(w)
    assert q.data.float().abs().max().item() == 448.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_refused_with_tensor_name(bad):
    w = torch.ones(4, 4)
    w[2, 3] = bad
    with pytest.raises(NonFiniteError, match=r"model.layers.0.mlp.up_proj.weight.*\(2, 3\)"):
        FP8.quantize_weight(w, name="model.layers.0.mlp.up_proj.weight")


def test_bad_rank_and_dtype_refused():
    with pytest.raises(QuantrollError, match="2-D"):
        FP8.quantize_weight(torch.ones(2, 2, 2), name="w3d")
    with pytest.raises(QuantrollError, match="dtype"):
        FP8.quantize_weight(torch.ones(2, 2, dtype=torch.int32), name="wint")

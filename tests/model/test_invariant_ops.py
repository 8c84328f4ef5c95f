"""The batch-invariant ops (model/invariant.py) on their own: each value independent of the
batch, of the row's place, of padding and of chunking, and close to the ordinary op."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from quantroll.model import invariant
from quantroll.model.kernel_config import INVARIANT_KERNELS


def test_tree_sum_ignores_trailing_padding_and_is_a_sum():
    x = torch.randn(3, 37)
    ref = invariant.tree_sum(x)
    for extra in (1, 2, 27, 91):
        padded = torch.cat([x, torch.full((3, extra), -0.0)], 1)
        assert torch.equal(invariant.tree_sum(padded), ref)
    assert torch.allclose(ref, x.sum(-1), atol=1e-5)
    assert torch.allclose(invariant.tree_sum(x.double()), x.double().sum(-1))


@pytest.mark.parametrize("n,k", [(512, 256), (8, 256), (256, 768)])
def test_tiled_gemm_row_does_not_depend_on_the_batch(n, k):
    w = torch.randn(n, k).bfloat16().float()
    x = torch.randn(70, k)
    alone = invariant.matmul_tiles(x[5:6], w, 16)
    for m in (6, 17, 33, 70):
        assert torch.equal(invariant.matmul_tiles(x[:m], w, 16)[5:6], alone)
    assert torch.equal(invariant.matmul_tiles(x[5:], w, 16)[:1], alone)  # another place in its tile
    assert torch.allclose(invariant.matmul_tiles(x, w, 16), F.linear(x, w), atol=1e-4)


def test_attention_decode_prefill_and_causal_agree_bitwise():
    torch.manual_seed(0)
    s, t, h, hkv, d = 2, 11, 4, 2, 16
    q, k, v = torch.randn(s, t, h, d), torch.randn(s, t, hkv, d), torch.randn(s, t, hkv, d)
    causal = invariant.causal_attention(q, k, v)
    # one query at position p over a cache padded to 20 keys (decode), zeros past the context
    pad = lambda x: torch.cat([x, torch.zeros(s, 9, hkv, d)], 1)  # noqa: E731
    for p in (0, 4, 10):
        one = invariant.attention(q[:, p:p + 1], pad(k), pad(v), torch.full((s, 1), p))
        assert torch.equal(one[:, 0], causal[:, p])
    chunk = invariant.attention(q[:, 3:8], pad(k), pad(v), torch.arange(3, 8).expand(s, 5), max_elements=100)
    assert torch.equal(chunk, causal[:, 3:8])
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         enable_gqa=True).transpose(1, 2)
    assert torch.allclose(causal, ref, atol=1e-5)


def test_straight_through_gradients_are_the_ordinary_ones():
    x = torch.randn(5, 32, requires_grad=True)
    w = torch.randn(8, 32, requires_grad=True)
    invariant.linear(x, w, None, dataclasses.replace(INVARIANT_KERNELS, gemm_rows=4)).square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    F.linear(x, w).square().sum().backward()
    assert torch.allclose(gx, x.grad, atol=1e-4) and torch.allclose(gw, w.grad, atol=1e-4)


def test_softmaxes_silu_norm_top_k_are_row_local_and_close():
    x = torch.randn(40, 129) * 4
    for fn, ref in ((invariant.log_softmax, lambda a: torch.log_softmax(a, -1)),
                    (invariant.softmax, lambda a: torch.softmax(a, -1)), (invariant.silu, F.silu)):
        assert torch.equal(fn(x)[7:8], fn(x[7:8]))
        assert torch.allclose(fn(x), ref(x), atol=1e-5)
    w = torch.rand(129)
    assert torch.equal(invariant.rms_norm(x, w, 1e-6)[3:4], invariant.rms_norm(x[3:4], w, 1e-6))
    ties = torch.tensor([[1.0, 3.0, 3.0, 2.0]])
    assert invariant.top_k(ties, 2).tolist() == [[1, 2]]


def test_the_startup_probe_names_a_gemm_that_is_not_invariant(monkeypatch):
    """model/invariance_probe refuses (one line, the op named) a GEMM whose row depends on the
    rows beside it, and, where the engine fuses projections, one whose column depends on its
    place in the weight; this CPU passes both with the real GEMM."""
    from quantroll.errors import QuantrollError
    from quantroll.model import invariance_probe
    from quantroll.model.kernel_config import INVARIANT_KERNELS

    shapes = [(96, 64), (64, 96)]
    invariance_probe.check_invariance(INVARIANT_KERNELS, torch.float32, "cpu", shapes)
    real = invariance_probe.matmul
    monkeypatch.setattr(invariance_probe, "matmul", lambda x, w, k: real(x, w, k) + 1e-3 * x.shape[0])
    with pytest.raises(QuantrollError, match="a row of a 64 x 96 product differently depending on the rows"):
        invariance_probe.check_invariance(INVARIANT_KERNELS, torch.float32, "cpu", shapes)
    monkeypatch.setattr(invariance_probe, "matmul", lambda x, w, k: real(x, w, k) + 1e-3 * torch.arange(w.shape[0]))
    invariance_probe.check_invariance(INVARIANT_KERNELS, torch.float32, "cpu", shapes)  # rows: fine
    with pytest.raises(QuantrollError, match="differently inside a fused projection"):
        invariance_probe.check_invariance(INVARIANT_KERNELS, torch.float32, "cpu", shapes, fused_shapes=shapes[:1])

"""Modes 2-4 in the trainer: quantized forward, straight-through BF16 backward, against float64."""

import pytest
import torch

from quantroll.formats import get_format
from quantroll.model.kernel_config import ForwardPlan, TrainFormat
from quantroll.model.linear import QLinear


@pytest.mark.parametrize("fmt_name", ["fp8", "mxfp8", "nvfp4"])
def test_forward_is_the_engine_quantization_and_backward_uses_original_operands(fmt_name):
    fmt = get_format(fmt_name)
    g = torch.Generator().manual_seed(0)
    layer = QLinear(256, 192, fmt=None, name="t", dtype=torch.float32)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(192, 256, generator=g) * 0.05)
    layer.plan = ForwardPlan(train=TrainFormat(fmt, frozenset({"t"})))  # a lone layer's hand-over
    x = torch.randn(3, 5, 256, generator=g, requires_grad=True)
    y = layer(x)
    # forward: exactly the engine's emulated computation
    want = fmt.dequantize(fmt.quantize_activation(x.detach())).double() @ fmt.dequantize(
        fmt.quantize_weight(layer.weight.detach())).double().t()
    assert torch.allclose(y.double(), want, rtol=0, atol=1e-5)
    # and not the BF16 one
    assert (y - x @ layer.weight.t()).abs().max() > 1e-3
    dy = torch.randn(3, 5, 192, generator=g)
    y.backward(dy)
    # backward: dX = dY W, dW = dY^T X on the unquantized operands (float64 reference)
    dx = dy.double() @ layer.weight.detach().double()
    dw = dy.double().reshape(-1, 192).t() @ x.detach().double().reshape(-1, 256)
    assert torch.allclose(x.grad.double(), dx, atol=1e-5)
    assert torch.allclose(layer.weight.grad.double(), dw, atol=1e-4)


def test_bf16_layer_without_train_format_is_plain_linear():
    layer = QLinear(64, 32, fmt=None, dtype=torch.float32)
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(4, 64)
    assert torch.equal(layer(x), x @ layer.weight.t())


@pytest.mark.parametrize("fmt_name", ["fp8", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("shape", [(384, 256), (130, 96)])
def test_quantized_linear_buffers_are_what_quantizing_gives(fmt_name, shape):
    """QLinear lays out its buffers from the format's stored layout (no placeholder is
    quantized, so the meta device works): the same shapes and dtypes as quantize_weight's
    output, for whole and partial blocks."""
    fmt = get_format(fmt_name)
    q = fmt.quantize_weight(torch.randn(*shape))
    for device in ("cpu", "meta"):
        layer = QLinear(shape[1], shape[0], fmt=fmt, device=device)
        held = layer.quantized_weight()
        for got, want in ((held.data, q.data), (held.scale, q.scale), (held.global_scale, q.global_scale)):
            assert (got is None) == (want is None)
            if got is not None:
                assert (tuple(got.shape), got.dtype) == (tuple(want.shape), want.dtype)
        assert held.block == q.block and held.data.device.type == device

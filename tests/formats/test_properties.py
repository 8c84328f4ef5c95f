"""Property tests (hypothesis) over shapes, magnitudes and dtypes, for every format."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantroll.formats import get_format
from quantroll.formats.elements import e8m0_decode
from tests.formats.bounds import assert_within_half_ulp

FORMATS = [("fp8", None), ("mxfp8", "ceil"), ("mxfp8", "ocp"), ("nvfp4", None)]


@st.composite
def weights(draw):
    rows = draw(st.integers(1, 300))
    cols = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**31 - 1))
    log_mag = draw(st.floats(-20, 20))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    zero_rows = draw(st.integers(0, rows))  # leading all-zero rows: whole zero blocks/groups
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * (2.0**log_mag)
    if dtype == torch.float16:  # keep within fp16's range and out of its subnormals
        w = w.clamp(-6e4, 6e4) * (2.0 ** (-log_mag))
    w[:zero_rows] = 0
    return w.to(dtype)


def _saturated(fmt_name, rule, q, x):
    if rule != "ocp":
        return None
    step = e8m0_decode(q.scale).repeat_interleave(32, dim=1)[:, : x.shape[1]]
    return x.abs() > 448 * step


@settings(max_examples=40, deadline=None)
@given(w=weights(), which=st.sampled_from(FORMATS))
def test_half_ulp_bound_zero_blocks_and_round_trip(w, which):
    name, rule = which
    fmt = get_format(name, rule)
    x = w.float()
    q = fmt.quantize_weight(w)
    deq = fmt.dequantize(q)
    assert deq.shape == w.shape and torch.isfinite(deq).all()
    slack = 0.0 if name == "mxfp8" else 2.0**-22
    assert_within_half_ulp(x, deq, fmt.ulp(q), slack=slack, exempt=_saturated(name, rule, q, x))
    assert torch.equal(deq[x == 0], torch.zeros_like(deq[x == 0]))  # zeros stay exactly zero
    # deterministic
    again = fmt.quantize_weight(w)
    assert torch.equal(q.data.view(torch.uint8), again.data.view(torch.uint8))
    # re-quantizing what was dequantized: values are a fixed point for every format
    q2 = fmt.quantize_weight(deq)
    assert torch.equal(fmt.dequantize(q2), deq) or name == "nvfp4"
    if name == "nvfp4":
        # codes and group scales bitwise; the float32 global may move by one ULP
        assert torch.equal(q.data, q2.data)
        assert torch.equal(q.scale.view(torch.uint8), q2.scale.view(torch.uint8))
        assert abs(q2.global_scale.item() - q.global_scale.item()) <= 2.0**-23 * q.global_scale.item()
    elif (name, rule) != ("mxfp8", "ceil") and w.dtype != torch.float32:
        assert torch.equal(q.data.view(torch.uint8), q2.data.view(torch.uint8))
        assert torch.equal(q.scale.view(torch.uint8), q2.scale.view(torch.uint8))


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 4), min_size=0, max_size=2), k=st.integers(1, 260),
       seed=st.integers(0, 2**31 - 1), which=st.sampled_from(FORMATS))
def test_activation_quantization_any_leading_shape(lead, k, seed, which):
    name, rule = which
    fmt = get_format(name, rule)
    x = torch.randn(*lead, k, generator=torch.Generator().manual_seed(seed))
    q = fmt.quantize_activation(x)
    assert q.shape == tuple(x.shape)
    assert q.scale.shape[:-1] == x.shape[:-1]
    deq = fmt.dequantize(q)
    rows = x.reshape(-1, k)
    qs = fmt.quantize_activation(rows)
    exempt = _saturated(name, rule, qs, rows)
    assert_within_half_ulp(rows, deq.reshape(-1, k), fmt.ulp(q).reshape(-1, k),
                           slack=0.0 if name == "mxfp8" else 2.0**-22, exempt=exempt)

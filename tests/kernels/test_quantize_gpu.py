"""GPU weight quantization == the CPU reference in quantroll.formats, bit for bit.

Run on a machine with a CUDA GPU and triton (skipped elsewhere): codes, scales and the
global scale are compared as bytes for every format, input dtype and many shapes.
"""

from __future__ import annotations

import pytest
import torch

from quantroll.errors import NonFiniteError
from quantroll.kernels import QuantizePlan, allocate_quantized, quantize_weight_gpu, quantize_weights_gpu
from tests.kernels.cases import (
    DTYPES,
    FORMAT_IDS,
    FORMATS,
    assert_bitwise_equal,
    e2m1_tie_weight,
    e4m3_tie_weight,
    fmt_of,
    mixed_weight,
    uniform_weight,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SHAPES = [(1, 1), (1, 4096), (4096, 1), (127, 129), (200, 300), (33, 17), (256, 31), (128, 128), (4096, 4096)]


def check(w: torch.Tensor, spec, **kw) -> None:
    fmt = fmt_of(spec)
    ref = fmt.quantize_weight(w.cpu())
    got = quantize_weight_gpu(w.cuda(), fmt, **kw)
    assert_bitwise_equal(ref, got)


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference_mixed_magnitudes(spec, dtype, shape):
    check(mixed_weight(shape, dtype, seed=shape[0] * 7 + shape[1]), spec)


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 1e2, 1e4])
def test_matches_reference_uniform_magnitude(spec, dtype, scale):
    check(uniform_weight((200, 300), dtype, scale, seed=int(scale * 1e6) % 9973), spec)


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_subnormal_inputs(spec, dtype):
    """Float32-subnormal values (bf16 holds them too): no flush-to-zero anywhere."""
    tiny = uniform_weight((192, 320), dtype, 1e-39, seed=3)
    check(tiny, spec)
    mixed = uniform_weight((192, 320), torch.float32, 1.0, seed=4)
    mixed[:128] *= 1e-39  # whole FP8 blocks of subnormals next to normal ones
    mixed[100, :32] = 1e-40
    check(mixed.to(dtype), spec)


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zeros(spec, dtype):
    check(torch.zeros(130, 70, dtype=dtype), spec)
    check(-torch.zeros(3, 33, dtype=dtype), spec)  # negative zeros keep their sign bit
    w = uniform_weight((300, 260), dtype, 1.0, seed=5)
    w[128:256, 128:256] = 0  # a whole zero FP8 block
    w[7, 32:64] = 0  # a zero MXFP8 group, two zero NVFP4 groups
    check(w, spec)


@pytest.mark.parametrize("spec", FORMATS[:3], ids=FORMAT_IDS[:3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_e4m3_ties(spec, dtype):
    check(e4m3_tie_weight(dtype, seed=1), spec)
    if dtype != torch.float16:
        check(e4m3_tie_weight(dtype, seed=2, exp_shift=-20), spec)
        check(e4m3_tie_weight(dtype, seed=3, exp_shift=20), spec)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_e2m1_ties(dtype):
    check(e2m1_tie_weight(dtype, seed=1), FORMATS[3])


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
def test_noncontiguous_input(spec):
    w = mixed_weight((300, 200), torch.bfloat16, seed=6).t()
    assert not w.is_contiguous()
    check(w, spec)


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
def test_out_written_in_place(spec):
    fmt = fmt_of(spec)
    w = mixed_weight((257, 520), torch.bfloat16, seed=7).cuda()
    out = allocate_quantized(tuple(w.shape), fmt, "cuda")
    for t in (out.data, out.scale) + (() if out.global_scale is None else (out.global_scale,)):
        t.view(torch.uint8).fill_(0x7F) if t.dim() else t.fill_(float("nan"))  # poison: every byte must be written
    ptrs = (out.data.data_ptr(), out.scale.data_ptr())
    got = quantize_weight_gpu(w, fmt, "w", out=out)
    assert (got.data.data_ptr(), got.scale.data_ptr()) == ptrs
    assert_bitwise_equal(fmt.quantize_weight(w.cpu()), got)


@pytest.mark.parametrize("branches", [1, 4], ids=["one-stream", "four-branches"])
@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
def test_many_and_plan(spec, branches):
    fmt = fmt_of(spec)
    shapes = [(256, 384), (192, 256), (4096, 1024), (31, 47), (128, 128)]
    dtypes = [torch.bfloat16, torch.float32, torch.bfloat16, torch.float16, torch.bfloat16]
    ws = [mixed_weight(s, d, seed=i).cuda() for i, (s, d) in enumerate(zip(shapes, dtypes))]
    names = [f"layers.{i}.weight" for i in range(len(ws))]
    for ref, got in zip([fmt.quantize_weight(w.cpu()) for w in ws], quantize_weights_gpu(ws, fmt, names)):
        assert_bitwise_equal(ref, got)
    plan = QuantizePlan(ws, fmt, names, branches=branches)
    assert plan.graph is not None
    ptrs = [q.data.data_ptr() for q in plan.outputs]
    for step in range(2):  # new values in place, as an optimizer step writes them
        for i, w in enumerate(ws):
            w.copy_(mixed_weight(tuple(w.shape), w.dtype, seed=100 * step + i))
        outs = plan.run()
        assert [q.data.data_ptr() for q in outs] == ptrs
        for w, got in zip(ws, outs):
            assert_bitwise_equal(fmt.quantize_weight(w.cpu()), got)


def test_nvfp4_many_without_overlap():
    fmt = fmt_of(FORMATS[3])
    ws = [mixed_weight(s, torch.bfloat16, seed=i).cuda() for i, s in enumerate([(256, 384), (31, 47), (4096, 1024)])]
    for w, got in zip(ws, quantize_weights_gpu(ws, fmt, overlap=False)):
        assert_bitwise_equal(fmt.quantize_weight(w.cpu()), got)


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_nonfinite_refused_with_reference_message(spec, dtype, bad):
    fmt = fmt_of(spec)
    w = uniform_weight((130, 200), dtype, 1.0, seed=8)
    w[129, 199] = bad  # in a partial edge block
    with pytest.raises(NonFiniteError) as ref_err:
        fmt.quantize_weight(w, "model.layers.3.mlp.up_proj.weight")
    with pytest.raises(NonFiniteError) as gpu_err:
        quantize_weight_gpu(w.cuda(), fmt, "model.layers.3.mlp.up_proj.weight")
    assert str(gpu_err.value) == str(ref_err.value)


@pytest.mark.parametrize("spec", FORMATS, ids=FORMAT_IDS)
def test_nonfinite_names_the_right_tensor(spec):
    fmt = fmt_of(spec)
    ws = [uniform_weight((64, 256), torch.bfloat16, 1.0, seed=i).cuda() for i in range(3)]
    names = ["a.weight", "b.weight", "c.weight"]
    ws[1][5, 7] = float("nan")
    with pytest.raises(NonFiniteError, match="'b.weight'"):
        quantize_weights_gpu(ws, fmt, names)
    ws[1][5, 7] = 0.0
    plan = QuantizePlan(ws, fmt, names)
    plan.run()
    ws[2][63, 255] = float("inf")  # the weight goes bad after the plan was built
    with pytest.raises(NonFiniteError, match="'c.weight'"):
        plan.run()
    ws[2][63, 255] = 1.0
    plan.run()  # flags are cleared on every run


# NVFP4 pass 2 has a bf16 kernel for rows of whole groups (K % 16 == 0; the shapes above
# with other K, and float16/float32, take the generic kernel): the cases below aim at it.
BF16_SHAPES = [(1, 16), (3, 48), (130, 16), (127, 144), (33, 272), (200, 320), (1000, 160), (4096, 1024)]
BF16_CONFIGS = [  # every kind of tile the bench sweeps: row tails inside a run of tiles, prefetch
    {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 1, "PREFETCH": False},
    {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 4, "PREFETCH": True},
    {"BM": 16, "G": 16, "num_warps": 4, "ITERS": 3, "PREFETCH": False},
    {"BM": 4, "G": 32, "num_warps": 4, "ITERS": 2, "PREFETCH": True},
]


def _nvfp4_check(w: torch.Tensor, **cfg) -> None:
    from quantroll.kernels.quantize_triton import nvfp4_bf16_path

    w = w.cuda()
    if w.dtype == torch.bfloat16 and w.shape[1] % 16 == 0:
        assert nvfp4_bf16_path(w, torch.empty(w.shape[0], w.shape[1] // 2, dtype=torch.uint8, device=w.device))
    check(w, FORMATS[3], **cfg)


@pytest.mark.parametrize("cfg", [{}] + BF16_CONFIGS, ids=["default"] + [str(i) for i in range(len(BF16_CONFIGS))])
@pytest.mark.parametrize("shape", BF16_SHAPES, ids=str)
def test_nvfp4_bf16_kernel_mixed(shape, cfg):
    _nvfp4_check(mixed_weight(shape, torch.bfloat16, seed=shape[0] * 11 + shape[1]), **cfg)


@pytest.mark.parametrize("cfg", [{}] + BF16_CONFIGS[1:2], ids=["default", "prefetch"])
@pytest.mark.parametrize("scale", [1e-39, 1e-30, 1e-20, 1e-6, 1.0, 1e4, 1e30])
def test_nvfp4_bf16_kernel_uniform(scale, cfg):
    """Global scales from the clamp at FP32_TINY through the tiny-tensor branch (< 2**-80) to huge."""
    _nvfp4_check(uniform_weight((96, 256), torch.bfloat16, scale, seed=int(scale * 1e6) % 9973 + 1), **cfg)


def test_nvfp4_bf16_kernel_generic_equal():
    """The generic kernel gives the same bytes on the same bf16 weight (both equal the reference)."""
    w = mixed_weight((300, 512), torch.bfloat16, seed=12)
    check(w, FORMATS[3])
    check(w, FORMATS[3], generic=True)


def test_nvfp4_bf16_zeros_and_signs():
    w = torch.zeros(40, 64, dtype=torch.bfloat16)
    _nvfp4_check(w)  # all-zero tensor: global 1, every scale 0
    _nvfp4_check(-w)  # negative zeros keep their sign bit
    w = uniform_weight((40, 64), torch.bfloat16, 1.0, seed=9)
    w[3] = 0  # zero groups (scale 0) beside nonzero ones
    w[5, 16:32] = -0.0
    w[7, :16] = torch.tensor([-0.0, 0.0] * 8, dtype=torch.bfloat16)
    w[9, 32:48] = -w[9, 32:48].abs()  # a group of negatives only
    _nvfp4_check(w)


E2M1_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _near_threshold_weight(amax: float, seed: int) -> tuple[torch.Tensor, int]:
    """A bf16 weight whose quotients x / (s * global) land on or next to the E2M1 rounding
    thresholds, returned with how many land within 2 float32 ulps of one without equalling it.

    With a tensor amax of 3m * 2**e (m not a multiple of 7), global = RN(amax / 2688) is
    inexact, yet x = t * s * amax / 2688 is a bf16 number when the group scale s is 1.75 *
    2**k (1.5 * 2**k for t = 1.75 and 3.5): x / RN(s * global) is then t up to the roundings
    of global and of s * global, a few ulps. Those are the quotients where a division off by
    an ulp, or rounding that breaks ties otherwise, changes the code; the reference's own
    float32 quotient may even round onto the threshold (a tie) from an inexact value."""
    g = torch.Generator().manual_seed(seed)
    gs = torch.tensor(amax) / torch.tensor(2688.0)
    groups, near = [], 0
    for t in E2M1_THRESHOLDS:
        for k in (-6, -3, -1, 0, 2, 5, 7):
            s = (1.5 if t in (1.75, 3.5) else 1.75) * 2.0**k
            gmax = torch.tensor(6 * s * float(gs)).to(torch.bfloat16).float()
            x = t * s * amax / 2688  # exact in float64, and a bf16 number
            assert torch.tensor(x).to(torch.bfloat16).double().item() == x
            if gmax < x or (gmax / torch.tensor(6.0) / gs).to(torch.float8_e4m3fn).float() != s:
                continue
            xb = torch.tensor([x]).to(torch.bfloat16)
            up = (xb.view(torch.int16) + 1).view(torch.bfloat16).float()
            down = (xb.view(torch.int16) - 1).view(torch.bfloat16).float()
            q = torch.tensor([x], dtype=torch.float32) / (torch.tensor(s) * gs)
            near += int((q != t) & ((q - t).abs() <= 2 * t * 2.0**-23))
            rest = torch.rand(10, generator=g) * gmax
            grp = torch.cat([gmax.view(1), torch.tensor([x, x, x]), up.clamp(max=gmax), down, rest])
            signs = torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0)
            signs[:2] = 1.0
            signs[2] = -1.0
            groups.append(grp * signs)
    while len(groups) % 4:
        groups.append(torch.zeros(16))
    w = torch.stack(groups).reshape(-1, 4 * 16)
    w[0, 0] = amax
    return w.to(torch.bfloat16), near


def test_nvfp4_quotients_at_e2m1_thresholds():
    near = 0
    for i, m in enumerate((3, 9, 15, 33, 45, 51, 57, 69, 75, 81, 87, 93, 99, 111, 117, 123)):
        w, n = _near_threshold_weight(float(m) * 2.0**(7 - i % 5), seed=i)
        near += n
        _nvfp4_check(w)
        _nvfp4_check(w.float())  # the generic kernel on the same values
        for cfg in BF16_CONFIGS[:2]:
            _nvfp4_check(w, **cfg)
    assert near >= 20, near  # the construction does put quotients next to the thresholds


def test_nvfp4_subnormal_group_scales_saturate():
    """Groups far below the tensor amax get E4M3-subnormal scales (2**-9 .. 2**-7), rounded
    down by up to a third, so quotients reach ~9: codes saturate at 6 (code 7)."""
    g = torch.Generator().manual_seed(5)
    rows = []
    for k in range(64):
        t = (1 + 7 * torch.rand((), generator=g).item()) * 2.0**-10  # amax/6/global in [2**-10, 2**-7)
        grp = torch.rand(16, generator=g) * 6 * t
        grp[0] = 6 * t
        grp[1] = 6 * t * (1 - 2.0**-6)
        rows.append(grp * torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0))
    w = torch.stack(rows).reshape(8, 128)
    w[0, 0] = 2688.0  # global scale exactly 1
    _nvfp4_check(w.to(torch.bfloat16))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nvfp4_bf16_kernel_nonfinite_refused(bad):
    fmt = fmt_of(FORMATS[3])
    w = uniform_weight((130, 208), torch.bfloat16, 1.0, seed=8)
    w[129, 207] = bad
    with pytest.raises(NonFiniteError) as ref_err:
        fmt.quantize_weight(w, "w")
    with pytest.raises(NonFiniteError) as gpu_err:
        quantize_weight_gpu(w.cuda(), fmt, "w")
    assert str(gpu_err.value) == str(ref_err.value)


def test_e2m1_rounding_every_float32():
    """The bf16 kernel's E2M1 rounding (max of two roundings) against elements.e2m1_encode on
    every non-negative float32 below 11 (the largest quotient pass 2 can meet is about 9;
    above 7 both saturate)."""
    from quantroll.formats.elements import e2m1_encode
    from quantroll.kernels.quantize_triton import e2m1_check

    top, step = 0x41300000, 1 << 26
    for start in range(0, top, step):
        q = torch.arange(start, min(start + step, top), device="cuda", dtype=torch.int32).view(torch.float32)
        got = e2m1_check(q)
        ref = e2m1_encode(q)  # comparisons only: the same on every device
        bad = got != ref
        assert not bool(bad.any()), (
            f"{int(bad.sum())} codes differ, e.g. q = {q[bad][:4].tolist()}: {got[bad][:4].tolist()} != {ref[bad][:4].tolist()}"
        )


def _check_division(a: torch.Tensor, d: torch.Tensor, mode: int = 0) -> int:
    """mode 0 (FP8, tiny NVFP4 tensors): exact for quotients >= 2**-100, any positive divisor;
    mode 1 (NVFP4): exact for quotients >= 2**-3 and divisors >= 2**-89, smaller ones < 0.25."""
    from quantroll.kernels.quantize_triton import div_check

    fast, ref = div_check(a.contiguous(), d.contiguous(), mode)
    domain = torch.isfinite(ref) & (ref <= 1024)  # every quotient the formats take is below ~900
    if mode == 1:
        domain &= d >= 2.0**-89
    small = 2.0**-100 if mode == 0 else 2.0**-3  # below it every code is zero whatever the last bits
    exact = domain & (ref >= small)
    bad = exact & (fast.view(torch.int32) != ref.view(torch.int32))
    assert not bool(bad.any()), (
        f"{int(bad.sum())} quotients differ, e.g. {a[bad][:4].tolist()} / {d[bad][:4].tolist()}: "
        f"{fast[bad][:4].tolist()} != {ref[bad][:4].tolist()}"
    )
    assert bool((fast[domain & ~exact] < (2.0**-98 if mode == 0 else 0.25)).all())
    return int(exact.sum())


@pytest.mark.parametrize("mode", [0, 1])
def test_division_fast_path_equals_div_rn_random(mode):
    """The per-element division (div.rn.f32's fast path with the reciprocal hoisted) against
    div.rn.f32 itself, on 16M random operand pairs over every binade, subnormal divisors too."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 1 << 24
    lo = 1 if mode == 0 else 0x13000000  # mode 1: divisors from 2**-89
    d = torch.randint(lo, 0x7E800000, (n,), device="cuda", generator=g, dtype=torch.int32).view(torch.float32)
    u = torch.randint(0x30800000, 0x44800000, (n,), device="cuda", generator=g, dtype=torch.int32).view(torch.float32)
    a = d * u  # quotients near every value in [2**-30, 1024), with random last bits
    a2 = (a.view(torch.int32) + torch.randint(-3, 4, (n,), device="cuda", generator=g, dtype=torch.int32)).view(torch.float32)
    assert _check_division(torch.cat([a, a2.abs()]), torch.cat([d, d]), mode) > n // 2


@pytest.mark.parametrize("mode", [0, 1])
def test_division_fast_path_equals_div_rn_bf16_exhaustive(mode):
    """Every positive finite bf16 dividend against 512 divisors (mantissas all ones, powers of
    two, FP8 and NVFP4-like scales, random)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.arange(0, 0x7F80, device="cuda", dtype=torch.int16).view(torch.bfloat16).float()
    specials = torch.tensor([1.0, 2.0**-126, 2.0**-149, 2.0**100, 1.9999999, 1.5, 448.0 / 448, 3.0 / 448,
                             0.75 * 2.0**-140, (2 - 2.0**-23) * 2.0**-20], device="cuda")
    rand = torch.randint(0x00000001, 0x7E800000, (502,), device="cuda", generator=g, dtype=torch.int32).view(torch.float32)
    d = torch.cat([specials, rand])
    aa = a[None, :].expand(d.numel(), -1).reshape(-1)
    dd = d[:, None].expand(-1, a.numel()).reshape(-1)
    assert _check_division(aa, dd, mode) > 0

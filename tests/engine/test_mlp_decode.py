"""The one-launch FP8 MLP (kernels/mlp_decode.py, experimental, off by default) against the
three launches it replaces (decode GEMM -> silu*up with FP8 quantization -> decode GEMM)
and a float64 reference of the same rounding steps.

CPU: its three phases as three launches under Triton's interpreter (a subprocess: this
file run as a script), bit for bit against the three launches; the interpreter's float
-> BF16/e4m3 casts are inexact, so both sit ~5e-2 from the float64 reference there. GPU: the one launch with its
grid barriers, bit for bit against the three launches (the same per-element arithmetic
on the same MMA path), repeated calls (the barrier resets itself), and an FP8 engine
with the switch on and off."""

from __future__ import annotations

import torch

from tests.interpreted import needs_new_interpreter, needs_triton, run_interpreted

GPU = torch.cuda.is_available()


def make_case(device: str, m: int, hidden: int, inter: int, seed: int = 0):
    from quantroll.formats import get_format
    from quantroll.kernels.fp8_linear import Fp8Activation

    fmt = get_format("fp8")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, hidden, generator=gen).to(torch.bfloat16)
    xq = fmt.quantize_activation(x.float())  # the reference quantizer's codes (exact on any device)
    wgu = fmt.quantize_weight(torch.randn(2 * inter, hidden, generator=gen) * 0.05)
    wd = fmt.quantize_weight(torch.randn(hidden, inter, generator=gen) * 0.05)
    act = Fp8Activation(xq.data.to(device), xq.scale.t().contiguous().t().to(device), x.shape, torch.bfloat16)
    return act, [t.to(device) for t in (wgu.data, wgu.scale, wd.data, wd.scale)], (xq, wgu, wd)


def three_launches(act, w) -> torch.Tensor:
    from quantroll.kernels.fp8_linear import fp8_gemm_decode
    from quantroll.kernels.fused import silu_mul

    gu = fp8_gemm_decode(act.codes, act.scales, w[0], w[1])
    h = silu_mul(gu, quantize=True)
    return fp8_gemm_decode(h.codes, h.scales, w[2], w[3])


def reference(quantized, inter: int) -> torch.Tensor:
    """float64 GEMMs with the three launches' BF16 roundings and the reference quantizer."""
    from quantroll.formats import get_format

    fmt = get_format("fp8")
    xq, wgu, wd = quantized
    gu = (fmt.dequantize(xq).double() @ fmt.dequantize(wgu).double().t()).to(torch.bfloat16).float()
    g, u = gu[:, :inter], gu[:, inter:]
    h = ((g / (1 + torch.exp(-g))).to(torch.bfloat16).float() * u).to(torch.bfloat16)
    hq = fmt.quantize_activation(h.float())
    return fmt.dequantize(hq).double() @ fmt.dequantize(wd).double().t()


def _rel(a, b) -> float:
    return ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()


def check_phased() -> None:
    from quantroll.kernels import fp8_linear
    from quantroll.kernels.mlp_decode import mlp_decode

    for m, hidden, inter, seed in ((1, 256, 1024, 0), (5, 384, 2048, 1), (16, 256, 1024, 2)):
        act, w, quantized = make_case("cpu", m, hidden, inter, seed)
        one = mlp_decode(act, *w, phased=True)
        three = three_launches(act, w)
        ref = reference(quantized, inter)
        assert one.shape == (m, hidden) and one.dtype == torch.bfloat16
        print(f"M={m}: three vs ref {_rel(three, ref):.2e}, one vs three {_rel(one, three):.2e}, one vs ref {_rel(one, ref):.2e}")
        # the interpreter's casts flip codes (4.6e-2 here; a wrong row, scale or phase gives ~1)
        assert _rel(three, ref) < 0.1, ("three launches off the reference", _rel(three, ref))
        assert torch.equal(one.view(torch.int16), three.view(torch.int16)), (m, hidden, inter, _rel(one, three))
        assert int(fp8_linear._tile_counters(torch.device("cpu")).abs().sum()) == 0, "split-K counters not reset"
    from quantroll.kernels.fp8_linear import DecodeGemmConfig, fp8_gemm_decode
    from quantroll.kernels.fused import silu_mul

    # another K split of the down GEMM (2; the default here is 4), as the bench sweeps: the three launches' bits at it
    h = silu_mul(fp8_gemm_decode(act.codes, act.scales, w[0], w[1]), quantize=True)
    want = fp8_gemm_decode(h.codes, h.scales, w[2], w[3], cfg=DecodeGemmConfig(split_k=2))
    assert torch.equal(mlp_decode(act, *w, phased=True, split=2).view(torch.int16), want.view(torch.int16))
    import pytest

    with pytest.raises(ValueError, match="multiple of 1024"):
        mlp_decode(act, w[0][:1000], w[1], w[2], w[3], phased=True)
    check_one_launch_form()


def check_one_launch_form() -> None:
    """PHASE 0 (the GPU's form: three phases and two grid barriers in one launch) under the
    interpreter, which runs programs one after another: with one program the barriers pass
    at once and the bits are the three launches'; with three, the first program's barrier
    gives up after max_spins polls and the host check raises (no hang, no silent result)."""
    import pytest

    from quantroll.errors import QuantrollError
    from quantroll.kernels import mlp_decode as md

    cpu = torch.device("cpu")
    act, w, _ = make_case("cpu", 3, 256, 1024, seed=4)
    three = three_launches(act, w)
    one = md.mlp_decode(act, *w, phased=False, programs=1, max_spins=2)
    assert torch.equal(one.view(torch.int16), three.view(torch.int16))
    md.raise_on_barrier_timeout(cpu)  # no timeout: no error
    assert md._barrier(cpu).tolist() == [0, 0, 0], "barrier not reset by the last program"
    md.mlp_decode(act, *w, phased=False, programs=3, max_spins=2)
    with pytest.raises(QuantrollError, match="timed out at a grid barrier"):
        md.raise_on_barrier_timeout(cpu)
    assert md._barrier(cpu).tolist() == [0, 0, 0], "flag and counters not reset after the error"
    print("one-launch form: barriers pass with one program, time out loudly with three")


@needs_triton
@needs_new_interpreter
def test_mlp_decode_phases_under_interpreter():
    run_interpreted([__file__], "mlp decode ok", timeout=600)


def test_resident_programs_per_sm_follows_the_occupancy_rules():
    """Hand-worked against the CUDA occupancy rules on an sm_90 SM (65,536 registers in four
    quarters, 228 KB shared memory, 2048 threads, 32 blocks)."""
    from quantroll.kernels.mlp_decode import resident_programs_per_sm

    # the worst register case for 2 warps: 255 -> 8,192 per warp, 2 per quarter, 8 warps -> 4 programs
    assert resident_programs_per_sm(12 * 1024, num_warps=2) == 4
    # Triton 3.8's compile (115 registers -> 3,840 per warp, 4 per quarter: 16 warps) -> 8
    assert resident_programs_per_sm(12 * 1024, num_warps=2, regs_per_thread=115) == 8
    # shared memory binds: 100 KB + 1 KB reserved, twice in 228 KB
    assert resident_programs_per_sm(100 * 1024, num_warps=2, regs_per_thread=32) == 2
    # threads bind: 32 regs, no shared memory, 8 warps -> 2048 / 256 = 8
    assert resident_programs_per_sm(0, num_warps=8, regs_per_thread=32) == 8
    assert resident_programs_per_sm(230 * 1024, num_warps=2) == 0


def test_applies_only_where_the_three_launches_do_not_split_gate_up():
    """Qwen3-8B's MLP (gate_up 24576 x 4096: 768 tiles, no K split) takes the one launch;
    Qwen3-1.7B's (12288 x 2048: 384 tiles, K split in two) does not, nor does any MLP
    once the float16 warpgroup MMA serves its rows."""
    from types import SimpleNamespace

    from quantroll.formats import get_format
    from quantroll.kernels import fp8_linear, mlp_decode
    from quantroll.kernels.fp8_linear import Fp8Activation
    from tests.engine.switches import switched

    fp8 = get_format("fp8")

    def linear(n_out, n_in):
        return SimpleNamespace(out_features=n_out, in_features=n_in, format=fp8, backend="fp8", bias=None)

    x = Fp8Activation(torch.zeros(4, 1, dtype=torch.float8_e4m3fn), torch.zeros(4, 1), torch.Size([4, 1]),
                      torch.bfloat16)
    with switched(mlp_decode, "FUSE_MLP_DECODE", True):
        assert mlp_decode.applies(x, linear(24576, 4096), linear(4096, 12288))
        assert not mlp_decode.applies(x, linear(12288, 2048), linear(2048, 6144))
        with switched(fp8_linear, "WGMMA_F16_FROM_M", 2):
            assert not mlp_decode.applies(x, linear(24576, 4096), linear(4096, 12288))


def test_switch_is_off_by_default():
    from quantroll.kernels import mlp_decode

    assert mlp_decode.FUSE_MLP_DECODE is False


if GPU:
    import pytest

    @pytest.mark.gpu
    @pytest.mark.parametrize("m", [1, 4, 16])
    def test_one_launch_equals_three_launches_on_gpu(m):
        from quantroll.kernels.mlp_decode import mlp_decode, raise_on_barrier_timeout

        act, w, quantized = make_case("cuda", m, 4096, 12288, seed=m)
        three = three_launches(act, w)
        for _ in range(3):  # the barrier and the split-K counters reset themselves
            one = mlp_decode(act, *w)
            assert torch.equal(one.view(torch.int16), three.view(torch.int16))
        raise_on_barrier_timeout("cuda")  # every program was resident: no barrier gave up
        phased = mlp_decode(act, *w, phased=True)
        assert torch.equal(phased.view(torch.int16), three.view(torch.int16))
        err = _rel(one, reference(quantized, 12288))
        print(f"M={m}: relative error vs float64 {err:.2e}")
        assert err < 1e-2

    @pytest.mark.gpu
    def test_fp8_engine_with_and_without_the_one_launch_mlp():
        from tests.engine.switches import assert_same_generations, engine_results_by_switch

        results = engine_results_by_switch("mlp_decode", "FUSE_MLP_DECODE")
        assert_same_generations(results[False], results[True])


def main() -> int:
    import os

    assert os.environ.get("TRITON_INTERPRET") == "1"
    check_phased()
    print("mlp decode ok")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

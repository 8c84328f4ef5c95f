"""The gate_up GEMM with silu * up and its FP8 quantization in one launch
(kernels/gate_up_silu.py, experimental, off by default) against the two launches it
replaces (the decode GEMM, then silu_mul with quantization): the same codes and scales,
bit for bit, since the arithmetic is the same op for op. (The MoE grouped GEMM's form
of the epilogue is checked in test_moe_kernels_interpreted.py; its engine test is here.)

CPU: under Triton's interpreter (a subprocess: this file run as a script), over row
counts on one and two row tiles, split-K 1/2/4 (the epilogue then runs in the last split
to arrive), tile heights 16/32/64 (2 to 8 tiles per group), and the counters reset. GPU:
the same on Qwen3-8B's MLP shape, and an FP8 engine with the switch on and off."""

from __future__ import annotations

import pytest
import torch

from tests.interpreted import needs_triton, run_interpreted

GPU = torch.cuda.is_available()


def _case(device: str, m: int, hidden: int, inter: int, seed: int):
    from quantroll.formats import get_format
    from quantroll.kernels.fp8_linear import Fp8Activation

    fmt = get_format("fp8")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, hidden, generator=gen).to(torch.bfloat16)
    xq = fmt.quantize_activation(x.float())
    wgu = fmt.quantize_weight(torch.randn(2 * inter, hidden, generator=gen) * 0.05)
    act = Fp8Activation(xq.data.to(device), xq.scale.t().contiguous().t().to(device), x.shape, torch.bfloat16)
    return act, wgu.data.to(device), wgu.scale.to(device)


def _two_launches(act, w, ws, cfg):
    from quantroll.kernels.fp8_linear import fp8_gemm_decode
    from quantroll.kernels.fused import silu_mul

    return silu_mul(fp8_gemm_decode(act.codes, act.scales, w, ws, cfg=cfg), quantize=True)


def _assert_same(one, two, label) -> None:
    assert one.shape == two.shape and one.codes.shape == two.codes.shape, label
    assert one.scales.stride() == two.scales.stride(), label
    assert torch.equal(one.codes.view(torch.uint8).cpu(), two.codes.view(torch.uint8).cpu()), (label, "codes")
    assert torch.equal(one.scales.cpu().view(torch.int32), two.scales.cpu().view(torch.int32)), (label, "scales")


def check_configs(device: str, hidden: int, inter: int, rows=(1, 5, 16, 20)) -> None:
    from quantroll.kernels import gate_up_silu as gus
    from quantroll.kernels.fp8_linear import DecodeGemmConfig, _tile_counters, decode_config
    from quantroll.kernels.fused import group_counters

    for m in rows:
        act, w, ws = _case(device, m, hidden, inter, seed=m)
        cfgs = [None, DecodeGemmConfig(block_n=16, split_k=2), DecodeGemmConfig(split_k=1),
                DecodeGemmConfig(split_k=4), DecodeGemmConfig(block_n=64, split_k=2, dot_f16=True, num_warps=4)]
        for cfg in cfgs:
            want = _two_launches(act, w, ws, cfg or decode_config(2 * inter, hidden, m))
            for _ in range(2):  # counters reset themselves
                _assert_same(gus.gate_up_silu(act, w, ws, cfg=cfg), want, (m, cfg))
            dev = w.device  # the counters are keyed by the tensors' device (cuda:0, not cuda)
            assert int(group_counters(dev).abs().sum()) == 0, "group counters not reset"
            assert int(_tile_counters(dev).abs().sum()) == 0, "split-K counters not reset"
    # a BF16 input is quantized first, as the linear would
    x = torch.randn(3, hidden, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16).to(device)
    from quantroll.kernels.fp8_linear import Fp8Activation, quantize_activation_fp8

    act = Fp8Activation(*quantize_activation_fp8(x), x.shape, x.dtype)
    _assert_same(gus.gate_up_silu(x, w, ws), gus.gate_up_silu(act, w, ws), "bf16 input")


def check_model() -> None:
    """A tiny FP8 model's fused forward (CPU tensors standing in for the GPU) gives the same
    bits with the switch on or off, and on, no silu_mul launch is left."""
    from quantroll.kernels import fused
    from quantroll.kernels import gate_up_silu as gus
    from quantroll.model import layers
    from tests.engine.switches import counting, fused_forward, switched
    from tests.engine.test_fused_quant import tiny_fp8_model

    inner = tiny_fp8_model("cpu", 384).model
    with switched(layers, "_on_gpu", lambda x: True), counting(fused, "silu_mul") as calls:
        for shape in ((1, 6), (3, 1)):
            outs = {}
            for on in (False, True):
                calls[0] = 0
                with switched(gus, "FUSE_SILU_EPILOGUE", on):
                    outs[on] = fused_forward(inner, shape, 320)
                assert calls[0] == (0 if on else 2), (shape, on, calls[0])
            assert torch.equal(outs[True].view(torch.int16), outs[False].view(torch.int16)), shape


def check_interpreted() -> None:
    check_configs("cpu", 512, 384)  # 3 groups of h; K of 4 blocks (split-K up to 4)
    check_model()
    from quantroll.kernels.gate_up_silu import gate_up_silu

    act, w, ws = _case("cpu", 2, 256, 320, seed=0)
    with pytest.raises(ValueError, match="multiple of 128"):
        gate_up_silu(act, w, ws)


@needs_triton
def test_gate_up_silu_under_interpreter():
    run_interpreted([__file__], "gate_up silu ok", timeout=600)


def test_switch_off_by_default_and_where_it_applies():
    from quantroll.formats import get_format
    from quantroll.kernels import gate_up_silu as gus
    from quantroll.model.linear import QLinear

    from tests.engine.switches import switched

    assert gus.FUSE_SILU_EPILOGUE is False
    fp8 = get_format("fp8")
    gu, down = QLinear(256, 768, fmt=fp8), QLinear(384, 256, fmt=fp8)
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    assert not gus.applies(x, gu, down)  # switch off
    with switched(gus, "FUSE_SILU_EPILOGUE", True):
        assert not gus.applies(x, gu, down)  # emulated backend
        gu.backend = down.backend = "fp8"
        assert gus.applies(x, gu, down)
        assert not gus.applies(torch.zeros(65, 256, dtype=torch.bfloat16), gu, down)  # past the decode GEMM
        odd_gu, odd_down = QLinear(256, 640, fmt=fp8), QLinear(320, 256, fmt=fp8)
        odd_gu.backend = odd_down.backend = "fp8"
        assert not gus.applies(x, odd_gu, odd_down)  # 320 is not whole 128-groups


if GPU:
    @pytest.mark.gpu
    def test_one_launch_equals_two_launches_on_gpu():
        check_configs("cuda", 4096, 12288, rows=(1, 16, 37, 64))

    @pytest.mark.gpu
    def test_fp8_engine_with_and_without_the_silu_epilogue():
        """Both runs on the Triton decode GEMM, whose epilogue this is: at these batches the
        CUDA decode GEMM (fp8_gemv) would otherwise take the unfused run's gate_up, and it
        adds the same products in another order."""
        from quantroll.kernels import fp8_gemv
        from tests.engine.switches import assert_same_generations, engine_results_by_switch, switched

        with switched(fp8_gemv, "MAX_M", 0):
            results = engine_results_by_switch("gate_up_silu", "FUSE_SILU_EPILOGUE")
        assert_same_generations(results[False], results[True])

    @pytest.mark.gpu
    def test_fp8_moe_engine_with_and_without_the_silu_epilogue():
        """The grouped experts' gate_up GEMM with the same epilogue (30B-A3B shape, 2 layers)."""
        from tests.engine.switches import assert_same_generations, engine_results_by_switch

        results = engine_results_by_switch("gate_up_silu", "FUSE_SILU_EPILOGUE", shape="qwen3-30b-a3b")
        assert_same_generations(results[False], results[True])


def main() -> int:
    import os

    assert os.environ.get("TRITON_INTERPRET") == "1"
    check_interpreted()
    print("gate_up silu ok")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

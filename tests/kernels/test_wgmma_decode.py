"""The warpgroup-MMA decode GEMM for 17-64 rows (kernels/cuda/wgmma_decode.cu, sm_90a; off
by default, wgmma_decode.FROM_M = 0): its launch shapes and build here; on an sm_90 GPU its
outputs against float64 (each BF16 output float64's value rounded, up to float32
summation slack), run to run, under CUDA-graph replay right after the kernel that writes
its input, and in the engine (issue 3's logits criterion, decode logprobs)."""

import pytest
import torch

from quantroll.kernels import cuda_jit, fp8_gemv, wgmma_decode
from tests.kernels.test_fp8_gemv import _excess_over_rounding, _operands, check_graph_replay_reads_the_new_input


def test_launch_shapes_hand_worked():
    """264 blocks wanted: Qwen3-8B qkv (96 tiles of 64 rows) in 3 splits of 11/11/10
    groups, o (64 tiles, 32 groups) in 5 of 7 (the last 4), gate_up (384 tiles) unsplit,
    down (64 tiles, 96 groups) in 5 of 20 (the last 16)."""
    assert wgmma_decode.default_config(6144, 4096) == wgmma_decode.WgmmaConfig(4, 1, 11)
    assert wgmma_decode.default_config(4096, 4096) == wgmma_decode.WgmmaConfig(4, 1, 7)
    assert wgmma_decode.default_config(24576, 4096) == wgmma_decode.WgmmaConfig(4, 1, 32)
    assert wgmma_decode.default_config(4096, 12288) == wgmma_decode.WgmmaConfig(4, 1, 20)
    assert wgmma_decode.default_config(64, 128) == wgmma_decode.WgmmaConfig(4, 1, 1)
    assert wgmma_decode.default_config(4096, 4096, 3, 2) == wgmma_decode.WgmmaConfig(3, 2, 7)
    assert wgmma_decode.WgmmaConfig(4, 1, 7).kernel == "wgmma_decode_s4_g1_b2"


def test_shared_bytes_hand_worked():
    # 4 stages of 64 rows x (128 + 16) bytes, two 16 KB float16 B tiles, 2 x 64 token scales,
    # 8 barriers
    assert wgmma_decode.WgmmaConfig(4, 1, 1).shared_bytes == 4 * 64 * 144 + 2 * 16384 + 512 + 64
    assert wgmma_decode.WgmmaConfig(3, 2, 1).shared_bytes == 3 * 64 * 272 + 2 * 16384 + 512 + 48


def test_shapes_the_kernel_takes():
    assert wgmma_decode.supports_shape(64, 4096, 4096) and wgmma_decode.supports_shape(17, 64, 128)
    assert not wgmma_decode.supports_shape(65, 4096, 4096)  # the token tile is 64
    assert not wgmma_decode.supports_shape(32, 4096 + 16, 4096)  # 64-row blocks
    assert not wgmma_decode.supports_shape(32, 4096, 4096 + 64)  # whole 128-groups
    assert not wgmma_decode.supports_shape(32, 4096, 4096, torch.float32)


def test_off_by_default_and_never_on_cpu_tensors():
    assert wgmma_decode.FROM_M == 0  # until the device has measured it (docs/PERFORMANCE.md)
    assert not wgmma_decode.usable(torch.device("cpu"))


def test_dispatch_takes_it_for_17_to_64_rows_when_on(monkeypatch):
    """fp8_linear.gemm_path: with FROM_M = 17 and the kernel usable, 17-64 rows of a
    supported shape take it; 16 rows, 65 rows and N not a multiple of 64 do not."""
    from quantroll.kernels import fp8_linear

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(wgmma_decode, "usable", lambda device: True)
    monkeypatch.setattr(fp8_gemv, "usable", lambda device: False)  # nvcc-less: the Triton kernel below 17
    assert fp8_linear.gemm_path(32, 4096, 4096, cuda) == "triton decode"  # off by default
    monkeypatch.setattr(wgmma_decode, "FROM_M", 17)
    assert [fp8_linear.gemm_path(m, 4096, 4096, cuda) for m in (16, 17, 64)] == [
        "triton decode", "cuda wgmma", "cuda wgmma"]
    assert fp8_linear.gemm_path(65, 4096, 4096, cuda) != "cuda wgmma"
    assert fp8_linear.gemm_path(32, 4096 + 16, 4096, cuda) == "triton decode"  # 64-row blocks


def test_arch_specific_target_flag():
    assert cuda_jit.arch_flag((9, 0), arch_specific=True) == "-gencode=arch=compute_90a,code=sm_90a"
    assert cuda_jit.arch_flag((9, 0)) == "-gencode=arch=compute_90,code=sm_90"


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_builds_for_hopper_with_warpgroup_mma(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTROLL_CACHE_DIR", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / wgmma_decode.SOURCE, (9, 0), arch_specific=True)
    image = cubin.read_bytes()
    for stages, gps, blocks in wgmma_decode.VARIANTS:
        assert wgmma_decode.WgmmaConfig(stages, gps, 1, blocks).kernel.encode() in image
    assert b"wgmma_decode_reduce" in image


def test_variants_list_matches_the_instances_in_the_source():
    import re

    source = (cuda_jit.SOURCE_DIR / wgmma_decode.SOURCE).read_text()
    found = re.findall(r"^QUANTROLL_WGMMA_DECODE\((\d+), (\d+), (\d+)\)", source, re.M)
    assert sorted(tuple(map(int, m)) for m in found) == sorted(wgmma_decode.VARIANTS)


gpu = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)
                         or cuda_jit.unavailable_reason() is not None,
                         reason="needs an sm_90 GPU (Hopper) and nvcc")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(17, 64, 128), (33, 192, 384), (64, 1024, 12288), (64, 6144, 4096),
                                   (40, 4096, 4096), (1, 128, 256), (64, 128, 1408)])
@pytest.mark.parametrize("stages,gps,blocks", wgmma_decode.VARIANTS)
def test_rounds_the_float64_result_and_repeats(m, n, k, stages, gps, blocks):
    aq, a_s, wq = _operands(m, n, k)
    for cfg in {wgmma_decode.default_config(n, k, stages, gps, blocks),
                wgmma_decode.WgmmaConfig(stages, gps, k // 128, blocks)}:  # split, and not (stages wrap)
        y = wgmma_decode.wgmma_decode(aq, a_s, wq.data, wq.scale, cfg)
        assert _excess_over_rounding(aq, a_s, wq, y) <= 0, cfg
        assert torch.equal(y, wgmma_decode.wgmma_decode(aq, a_s, wq.data, wq.scale, cfg, early=False)), cfg


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("stages,gps", [(4, 1), (3, 2)])
def test_scales_in_either_layout_a_row_slice_and_an_output_buffer(stages, gps):
    """The scales' strides, a row slice of the codes (row stride and scale offset carry
    over) and ``out=``, split and not."""
    aq, a_s, wq = _operands(40, 256, 1024)
    for cfg in (wgmma_decode.WgmmaConfig(stages, gps, 8), wgmma_decode.WgmmaConfig(stages, gps, 3)):
        y = wgmma_decode.wgmma_decode(aq, a_s, wq.data, wq.scale, cfg)
        assert torch.equal(y, wgmma_decode.wgmma_decode(aq, a_s.contiguous(), wq.data, wq.scale, cfg)), cfg
        out = torch.empty_like(y)
        assert wgmma_decode.wgmma_decode(aq, a_s, wq.data, wq.scale, cfg, out=out) is out and torch.equal(out, y), cfg
        part = wgmma_decode.wgmma_decode(aq[2:30], a_s[2:30], wq.data, wq.scale, cfg)
        assert _excess_over_rounding(aq[2:30], a_s[2:30], wq, part) <= 0, cfg


@gpu
@pytest.mark.gpu
def test_graph_replay_after_a_kernel_that_writes_the_input():
    check_graph_replay_reads_the_new_input(wgmma_decode.wgmma_decode, 48, 4096, 4096)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind,batch", [("dense", 4), ("moe", 4)])
def test_logits_criterion_with_the_warpgroup_decode_gemm(kind, batch, tmp_path, monkeypatch):
    """Issue 3's criterion with every decode GEMM of 1-64 rows on this kernel (4 prompts
    are 36 rows)."""
    from tests.engine.test_gpu_engine import test_real_fp8_logits_vs_emulation_on_the_warm_started_model as check

    monkeypatch.setattr(fp8_gemv, "MAX_M", 0)
    monkeypatch.setattr(wgmma_decode, "FROM_M", 1)
    check(kind, batch, tmp_path)


@gpu
@pytest.mark.gpu
def test_engine_decode_logprobs_match_a_full_forward(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from tests.engine.test_gpu_engine import test_fp8_engine_decode_logprobs_match_a_full_forward_of_its_tokens as check

    monkeypatch.setattr(fp8_gemv, "MAX_M", 0)
    monkeypatch.setattr(wgmma_decode, "FROM_M", 1)
    check(tmp_path)

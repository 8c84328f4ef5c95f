"""The decode GEMM with token codes shared by a block's row groups
(kernels/cuda/fp8_gemv_shared.cu): its variants and build here; on a GPU its outputs:
float64's value rounded to BF16 (up to float32 summation slack), the bits of the register
kernel with as many row tiles and warps as K slices where that one is compiled, equal
across variants with as many K slices, repeatable, and under graph replay right after the
kernel that writes its input, with K groups the slices do not fill, batches smaller than
the token tiles, and staged tokens above the 48 KB that need the opt-in."""

import dataclasses
import re

import pytest
import torch

from quantroll.kernels import cuda_jit, fp8_gemv, fp8_gemv_shared
from tests.kernels.test_fp8_gemv import _excess_over_rounding, _operands, check_graph_replay_reads_the_new_input


def test_variants_list_matches_the_instances_in_the_source():
    source = (cuda_jit.SOURCE_DIR / fp8_gemv_shared.SOURCE).read_text()
    found = re.findall(r"^QUANTROLL_FP8_GEMV_SHARED\(" + ", ".join([r"(\d+)"] * 7) + r"\)", source, re.M)
    assert [tuple(map(int, m)) for m in found] == [dataclasses.astuple(c) for c in fp8_gemv_shared.VARIANTS]


def test_shape_of_a_variant_hand_worked():
    cfg = fp8_gemv_shared.SharedConfig(2, 1, 4, 2, 1, 1, 1)
    assert (cfg.rows, cfg.threads, cfg.kernel) == (64, 256, "fp8_gemv_shared_mt2_rt1_r4_k2_u1_p1_s1")
    assert cfg.shared_bytes(16, 4096) == 16 * 4112 and cfg.shared_bytes(3, 256) == 3 * 272
    assert fp8_gemv_shared.SharedConfig(2, 1, 2, 4, 1, 1, 0).shared_bytes(16, 4096) == 0  # tokens met in L1
    assert fp8_gemv_shared.SharedConfig(2, 1, 2, 4, 1, 1, 1).twin == fp8_gemv.GemvConfig(2, 1, 4, 1, 1)  # first compiled
    assert cfg.twin is None  # no 2-warp register variant


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("capability", [(8, 9), (9, 0)])
def test_source_builds_for_ada_and_hopper(capability, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTROLL_CACHE_DIR", str(tmp_path))
    image = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / fp8_gemv_shared.SOURCE, capability).read_bytes()
    assert all(c.kernel.encode() in image for c in fp8_gemv_shared.VARIANTS)


def test_shapes_it_cannot_take_are_refused_in_one_line():
    cfg = fp8_gemv_shared.SharedConfig(1, 2, 2, 2, 2, 0, 0)
    wq = torch.zeros(64, 128, dtype=torch.float8_e4m3fn)
    assert fp8_gemv_shared.supports(torch.zeros(8, 128, dtype=torch.float8_e4m3fn), wq, cfg)
    aq = torch.zeros(9, 128, dtype=torch.float8_e4m3fn)  # 9 rows for one token tile of 8
    assert not fp8_gemv_shared.supports(aq, wq, cfg)
    with pytest.raises(ValueError, match="do not fit fp8_gemv_shared_mt1_rt2_r2_k2_u2_p0_s0"):
        fp8_gemv_shared.fp8_gemv_shared(aq, torch.ones(9, 1), wq, torch.ones(1, 1), cfg)
    assert not fp8_gemv_shared.supports(torch.zeros(8, 128, dtype=torch.float8_e4m3fn),
                                        torch.zeros(96, 128, dtype=torch.float8_e4m3fn), cfg)  # 96 % 64
    staged = fp8_gemv_shared.SharedConfig(2, 1, 4, 1, 2, 1, 1)
    wide = torch.zeros(64, 12288, dtype=torch.float8_e4m3fn)
    assert fp8_gemv_shared.supports(torch.zeros(8, 12288, dtype=torch.float8_e4m3fn), wide, staged)  # 98 KB
    assert not fp8_gemv_shared.supports(torch.zeros(16, 12288, dtype=torch.float8_e4m3fn), wide, staged)  # 197 KB


gpu = pytest.mark.skipif(not torch.cuda.is_available() or cuda_jit.unavailable_reason() is not None,
                         reason="needs a CUDA GPU with FP8 conversions and nvcc")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (5, 256, 384), (9, 512, 1152), (16, 4096, 4096), (3, 128, 640),
                                   (16, 1024, 12288), (7, 1024, 12288)])
def test_rounds_the_float64_result_repeats_and_matches_its_twin(m, n, k):
    aq, a_s, wq = _operands(m, n, k)
    by_slices = {}  # K slices -> the first output: every variant with as many slices sums in the same order
    for cfg in fp8_gemv_shared.VARIANTS:
        if not fp8_gemv_shared.supports(aq, wq.data, cfg):
            continue
        y = fp8_gemv_shared.fp8_gemv_shared(aq, a_s, wq.data, wq.scale, cfg)
        assert _excess_over_rounding(aq, a_s, wq, y) <= 0, cfg
        assert torch.equal(y, fp8_gemv_shared.fp8_gemv_shared(aq, a_s, wq.data, wq.scale, cfg, early=False)), cfg
        if cfg.twin is not None:
            assert torch.equal(y, fp8_gemv.fp8_gemv(aq, a_s, wq.data, wq.scale, cfg.twin)), cfg
        assert torch.equal(y, by_slices.setdefault(cfg.k_slices, y)), cfg


@gpu
@pytest.mark.gpu
def test_scales_in_either_layout_and_a_row_slice_of_the_codes():
    aq, a_s, wq = _operands(12, 256, 512)
    cfg = fp8_gemv_shared.SharedConfig(2, 1, 2, 4, 1, 1, 1)
    y = fp8_gemv_shared.fp8_gemv_shared(aq, a_s, wq.data, wq.scale, cfg)
    assert torch.equal(y, fp8_gemv_shared.fp8_gemv_shared(aq, a_s.contiguous(), wq.data, wq.scale, cfg))
    y8 = fp8_gemv_shared.fp8_gemv_shared(aq[2:10], a_s[2:10], wq.data, wq.scale, cfg)
    assert _excess_over_rounding(aq[2:10], a_s[2:10], wq, y8) <= 0


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("staged", [1, 0])
def test_graph_replay_after_a_kernel_that_writes_the_input(staged):
    cfg = fp8_gemv_shared.SharedConfig(2, 1, 4, 1, 2, 1, staged)
    check_graph_replay_reads_the_new_input(
        lambda *a, **kw: fp8_gemv_shared.fp8_gemv_shared(*a, cfg=cfg, **kw), 16, 4096, 4096)


@gpu
@pytest.mark.gpu
def test_launched_early_after_a_producer_that_releases_it():
    """The fused RMSNorm + quantize kernel releases its dependent at its start (Hopper,
    fp8_gemv.release_producers): in a graph, the GEMM then starts while the norm still
    writes the codes, and must read them only after griddepcontrol.wait."""
    from quantroll.kernels.fused import add_rmsnorm

    if not fp8_gemv.release_producers(torch.device("cuda")):
        pytest.skip("no early release here (needs Hopper and the CUDA decode GEMM)")
    cfg = fp8_gemv_shared.SharedConfig(2, 1, 4, 1, 2, 1, 1)
    _, _, wq = _operands(16, 4096, 4096)
    weight = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    x = torch.empty(16, 4096, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(16, 4096, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, act = add_rmsnorm(x, None, weight, 1e-6, quantize=True)
        fp8_gemv_shared.fp8_gemv_shared(act.codes, act.scales, wq.data, wq.scale, cfg, out=out)
    for seed in range(3):
        x.copy_(torch.randn(16, 4096, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _, want = add_rmsnorm(x, None, weight, 1e-6, quantize=True)
        assert torch.equal(out, fp8_gemv_shared.fp8_gemv_shared(want.codes, want.scales, wq.data, wq.scale, cfg,
                                                                early=False)), seed

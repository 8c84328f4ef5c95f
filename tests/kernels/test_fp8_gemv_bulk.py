"""The bulk-copy decode GEMM (kernels/cuda/fp8_gemv_bulk.cu): its variants and build, and on
a Hopper GPU its outputs: the same bits as the register kernel with the same warps (same
work split, same order of sums), float64's value rounded to BF16 (up to float32 summation
slack), repeatable, under graph replay right after the kernel writing its input, with
blocks walking several row tiles and chunks of K that the warps do not fill."""

import itertools
import re

import pytest
import torch

from quantroll.kernels import cuda_jit, fp8_gemv, fp8_gemv_bulk
from tests.kernels.test_fp8_gemv import _excess_over_rounding, _operands, check_graph_replay_reads_the_new_input


def test_variants_list_matches_the_instances_in_the_source():
    source = (cuda_jit.SOURCE_DIR / fp8_gemv_bulk.SOURCE).read_text()
    found = re.findall(r"^QUANTROLL_FP8_GEMV_BULK\((\d+), (\d+), (\d+), (\d+)\)", source, re.M)
    assert {tuple(map(int, m)) for m in found} == {(c.token_tiles, c.warps, c.stages, c.resident)
                                                   for c in fp8_gemv_bulk.VARIANTS}
    assert len(found) == len(fp8_gemv_bulk.VARIANTS)
    assert all(cfg in fp8_gemv_bulk.VARIANTS for cfg in fp8_gemv_bulk.CHOICE.values())


def test_shared_bytes_hand_worked():
    # 2 token tiles, 4 warps, 4 stages, per-stage tokens: a stage is 16 weight rows + 16 token
    # rows of 4 * 128 + 16 bytes; then 4 warps x 16 rows x 17 floats; 9 barriers of 8 bytes
    assert fp8_gemv_bulk.BulkConfig(2, 4, 4, 0).shared_bytes(4096) == 4 * 32 * 528 + 4 * 16 * 17 * 4 + 9 * 8
    # resident tokens: stages hold weights only; 16 token rows of K + 16 bytes once
    assert fp8_gemv_bulk.BulkConfig(2, 4, 4, 1).shared_bytes(4096) == 4 * 16 * 528 + 16 * 4112 + 4 * 16 * 17 * 4 + 72
    assert fp8_gemv_bulk.PARTIAL_ROW == {t: 8 * t + 1 for t in (1, 2)}


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_builds_for_hopper(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTROLL_CACHE_DIR", str(tmp_path))
    image = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / fp8_gemv_bulk.SOURCE, (9, 0)).read_bytes()
    assert all(c.kernel.encode() in image for c in fp8_gemv_bulk.VARIANTS)


hopper = pytest.mark.skipif(not torch.cuda.is_available() or cuda_jit.unavailable_reason() is not None
                            or torch.cuda.get_device_capability()[0] < 9,
                            reason="needs a Hopper (or newer) GPU and nvcc")


def _register_twin(cfg):
    """The register kernel with the same token tiles and warps (one row tile), if compiled."""
    return next((c for c in fp8_gemv.VARIANTS if (c.token_tiles, c.row_tiles, c.warps) == (cfg.token_tiles, 1, cfg.warps)),
                None)


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 16, 128), (5, 48, 384), (9, 272, 1152), (16, 4096, 4096), (3, 96, 640),
                                   (16, 1024, 12288)])
def test_same_bits_as_the_register_kernel_and_float64_rounded(m, n, k):
    aq, a_s, wq = _operands(m, n, k)
    for cfg, per_sm in itertools.product(fp8_gemv_bulk.VARIANTS, (0, 1)):
        cfg = fp8_gemv_bulk.BulkConfig(cfg.token_tiles, cfg.warps, cfg.stages, cfg.resident, per_sm)
        if not fp8_gemv_bulk.supports(aq, wq.data, cfg):
            continue
        y = fp8_gemv_bulk.fp8_gemv_bulk(aq, a_s, wq.data, wq.scale, cfg)
        assert _excess_over_rounding(aq, a_s, wq, y) <= 0, cfg
        assert torch.equal(y, fp8_gemv_bulk.fp8_gemv_bulk(aq, a_s, wq.data, wq.scale, cfg, early=False)), cfg
        twin = _register_twin(cfg)
        if twin is not None:
            assert torch.equal(y, fp8_gemv.fp8_gemv(aq, a_s, wq.data, wq.scale, twin)), (cfg, twin)


@hopper
@pytest.mark.gpu
def test_blocks_walk_many_tiles():
    """One block per multiprocessor on 24576 rows: each block takes ~186 row tiles, and the
    stages' phases wrap many times."""
    aq, a_s, wq = _operands(16, 24576, 4096)
    cfg = fp8_gemv_bulk.BulkConfig(2, 4, 2, 0, blocks_per_sm=1)
    y = fp8_gemv_bulk.fp8_gemv_bulk(aq, a_s, wq.data, wq.scale, cfg)
    assert torch.equal(y, fp8_gemv.fp8_gemv(aq, a_s, wq.data, wq.scale, fp8_gemv.GemvConfig(2, 1, 4, 1, 1)))


@hopper
@pytest.mark.gpu
def test_scales_in_either_layout_and_a_row_slice_of_the_codes():
    aq, a_s, wq = _operands(12, 256, 512)
    cfg = fp8_gemv_bulk.BulkConfig(2, 4, 4, 1)
    y = fp8_gemv_bulk.fp8_gemv_bulk(aq, a_s, wq.data, wq.scale, cfg)
    assert torch.equal(y, fp8_gemv_bulk.fp8_gemv_bulk(aq, a_s.contiguous(), wq.data, wq.scale, cfg))
    y8 = fp8_gemv_bulk.fp8_gemv_bulk(aq[2:10], a_s[2:10], wq.data, wq.scale, cfg)
    assert _excess_over_rounding(aq[2:10], a_s[2:10], wq, y8) <= 0


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("resident", [0, 1])
def test_graph_replay_after_a_kernel_that_writes_the_input(resident):
    cfg = fp8_gemv_bulk.BulkConfig(2, 4, 2, resident)
    check_graph_replay_reads_the_new_input(
        lambda *a, **kw: fp8_gemv_bulk.fp8_gemv_bulk(*a, cfg=cfg, **kw), 16, 4096, 4096)


def test_shapes_it_cannot_take_are_refused_in_one_line():
    cfg = fp8_gemv_bulk.BulkConfig(1, 4, 4, 0)
    aq = torch.zeros(9, 128, dtype=torch.float8_e4m3fn)  # 9 rows for one token tile of 8
    wq = torch.zeros(16, 128, dtype=torch.float8_e4m3fn)
    assert not fp8_gemv_bulk.supports(aq, wq, cfg)
    with pytest.raises(ValueError, match="do not fit fp8_gemv_bulk_mt1_w4_s4_r0"):
        fp8_gemv_bulk.fp8_gemv_bulk(aq, torch.ones(9, 1), wq, torch.ones(1, 1), cfg)
    # resident token rows of a very long K do not fit shared memory
    assert not fp8_gemv_bulk.supports(torch.zeros(16, 16384, dtype=torch.float8_e4m3fn),
                                      torch.zeros(16, 16384, dtype=torch.float8_e4m3fn),
                                      fp8_gemv_bulk.BulkConfig(2, 4, 4, 1))

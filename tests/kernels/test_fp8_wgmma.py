"""The warpgroup decode GEMM for 1-64 rows (kernels/cuda/fp8_wgmma_ws.cu): its variants, its
sm_90a build, its launch shapes, and on a Hopper GPU its outputs against float64 (each
BF16 output float64's value rounded, up to float32 summation slack), run to run, with and
without K splits, under CUDA-graph replay after the kernel that writes its input."""

import dataclasses
import functools
import re

import pytest
import torch

from quantroll.kernels import cuda_jit, fp8_wgmma


def test_variants_list_matches_the_instances_in_the_source():
    source = (cuda_jit.SOURCE_DIR / fp8_wgmma.SOURCE).read_text()
    number = r"(\d+)"
    special = re.findall(rf"^QUANTROLL_FP8_WGMMA_WS\({', '.join([number] * 6)}\)", source, re.M)
    silu = re.findall(rf"^QUANTROLL_FP8_WGMMA_WS_SILU\({', '.join([number] * 6)}\)", source, re.M)
    pipe = re.findall(rf"^QUANTROLL_FP8_WGMMA_WS_PIPE\({', '.join([number] * 6)}\)", source, re.M)
    found = {(int(n), int(wg), int(d), int(b), int(pw), int(sl), False, False) for n, wg, pw, d, sl, b in special} | {
        (int(n), int(wg), int(d), int(b), int(pw), int(sl), True, False) for n, wg, pw, d, sl, b in silu} | {
        (int(n), int(wg), int(d), int(b), int(pw), int(sl), False, True) for n, wg, pw, d, sl, b in pipe}
    assert found == {(c.tokens, c.warpgroups, c.depth, c.min_blocks, c.producer_warps, c.slots, c.silu, c.pipelined)
                     for c in fp8_wgmma.VARIANTS + fp8_wgmma.SILU_VARIANTS}
    assert len(found) == len(special) + len(silu) + len(pipe)
    assert len(special) + len(pipe) == len(fp8_wgmma.VARIANTS) and fp8_wgmma.DEFAULT in fp8_wgmma.VARIANTS


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_builds_for_sm_90a_only(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTROLL_CACHE_DIR", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / fp8_wgmma.SOURCE, (9, 0))
    image = cubin.read_bytes()
    assert all(c.kernel.encode() in image for c in fp8_wgmma.VARIANTS + fp8_wgmma.SILU_VARIANTS)
    with pytest.raises(cuda_jit.CompileError, match=f"nvcc failed on {fp8_wgmma.SOURCE}"):  # no wgmma before Hopper
        cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / fp8_wgmma.SOURCE, (8, 9))


def test_arch_flag_names_the_arch_specific_target():
    assert cuda_jit.arch_flag((9, 0)) == "-gencode=arch=compute_90,code=sm_90"
    assert cuda_jit.arch_flag((9, 0), True) == "-gencode=arch=compute_90a,code=sm_90a"


@pytest.mark.parametrize("n,k", [(4096, 4096), (6144, 4096), (24576, 4096), (4096, 12288), (128, 128), (256, 1152)])
def test_launch_shape_covers_every_k_group_once(n, k):
    for cfg in fp8_wgmma.VARIANTS:
        if n % cfg.rows:
            continue
        for splits in (0, 1, 2, 3, 8, 200):
            tiles, used, per_split = fp8_wgmma.launch_shape(64, n, k, dataclasses.replace(cfg, splits=splits))
            groups = k // 128
            assert tiles * cfg.rows == n and 1 <= used <= groups
            assert (used - 1) * per_split < groups <= used * per_split  # no empty split, none left out


def test_shapes_outside_the_kernel_are_refused():
    n16 = next(c for c in fp8_wgmma.VARIANTS if c.tokens == 16)
    assert not fp8_wgmma.supports_shape(17, 4096, 4096, cfg=n16) and fp8_wgmma.supports_shape(16, 4096, 4096, cfg=n16)
    assert not fp8_wgmma.supports_shape(65, 4096, 4096)
    assert not fp8_wgmma.supports_shape(0, 4096, 4096)
    assert not fp8_wgmma.supports_shape(32, 4096, 4000)
    assert not fp8_wgmma.supports_shape(32, 4040, 4096)  # not a multiple of 64 rows
    assert not fp8_wgmma.supports_shape(32, 4096, 4096, torch.float32)
    assert fp8_wgmma.supports_shape(1, 128, 128) and fp8_wgmma.supports_shape(64, 24576, 4096)


def test_engine_configs_map_batch_ranges(monkeypatch):
    assert fp8_wgmma.engine_config(32) is None  # empty until a variant beats the other decode GEMMs
    n16 = next(c for c in fp8_wgmma.VARIANTS if c.tokens == 16)
    monkeypatch.setattr(fp8_wgmma, "ENGINE_CONFIGS", {(1, 16): n16, (33, 64): fp8_wgmma.DEFAULT})
    assert [fp8_wgmma.engine_config(m) for m in (1, 16, 17, 32, 33, 64, 65)] == [
        n16, n16, None, None, fp8_wgmma.DEFAULT, fp8_wgmma.DEFAULT, None]


def test_silu_twins_take_a_bf16_gate_up_of_the_weights_k_only():
    twin = next(c for c in fp8_wgmma.SILU_VARIANTS if c.tokens == 16)
    wq = torch.zeros(256, 384, dtype=torch.float8_e4m3fn)
    gate_up = torch.zeros(16, 768, dtype=torch.bfloat16)
    assert fp8_wgmma.supports_silu(gate_up, wq, twin)
    assert fp8_wgmma.supports_silu(gate_up.view(2, 8, 768), wq, twin)  # [batch, tokens, 2I]
    assert not fp8_wgmma.supports_silu(gate_up.float(), wq, twin)
    assert not fp8_wgmma.supports_silu(torch.zeros(17, 768, dtype=torch.bfloat16), wq, twin)  # more rows than the tile
    assert not fp8_wgmma.supports_silu(torch.zeros(16, 512, dtype=torch.bfloat16), wq, twin)  # I != K
    assert not fp8_wgmma.supports_silu(gate_up, wq, dataclasses.replace(twin, silu=False))
    assert fp8_wgmma.silu_config(gate_up, wq) is None  # off by default, and never on CPU tensors
    with pytest.raises(ValueError, match="silu twin"):
        fp8_wgmma.fp8_wgmma(wq[:16], torch.ones(16, 3), wq, torch.ones(2, 3), twin)


def test_shared_memory_fits_a_block_and_the_blocks_asked_for():
    for cfg in fp8_wgmma.VARIANTS + fp8_wgmma.SILU_VARIANTS:
        assert cfg.shared_bytes * cfg.min_blocks <= 227 * 1024, cfg  # H100/H200: 227 KB per block, 228 per SM
        assert cfg.threads * cfg.min_blocks <= 2048, cfg


def test_cpu_tensors_never_take_the_kernel():
    assert not fp8_wgmma.usable(torch.device("cpu"))


hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)
                            or cuda_jit.unavailable_reason() is not None,
                            reason="needs a Hopper GPU (sm_90a) and nvcc")


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (9, 384, 256), (16, 4096, 4096), (17, 128, 128), (33, 256, 1152),
                                   (64, 4096, 4096), (48, 6144, 4096), (64, 4096, 12288), (20, 24576, 4096)])
def test_every_variant_rounds_the_float64_result(m, n, k):
    from tests.kernels.test_fp8_gemv import _operands, check_rounds_and_repeats

    aq, a_s, wq = _operands(m, n, k)
    for base in fp8_wgmma.VARIANTS:
        if n % base.rows or m > base.tokens:
            continue
        for splits in (1, 0, 3):
            check_rounds_and_repeats(fp8_wgmma.fp8_wgmma, aq, a_s, wq, dataclasses.replace(base, splits=splits))


@hopper
@pytest.mark.gpu
def test_scales_in_either_layout_and_a_row_slice_of_the_codes():
    from tests.kernels.test_fp8_gemv import check_scale_layouts_and_row_slice

    check_scale_layouts_and_row_slice(fp8_wgmma.fp8_wgmma, 40, 2, 30)


# One variant of each consumer loop (one or two wgmma groups in flight) and tile width.
EACH_KERNEL = [next(c for c in fp8_wgmma.VARIANTS if c.pipelined == pipe and c.tokens == n)
               for pipe in (False, True) for n in (64, 32, 16)]


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", EACH_KERNEL, ids=lambda c: c.kernel)
def test_graph_replay_after_a_kernel_that_writes_the_input(cfg):
    from tests.kernels.test_fp8_gemv import check_graph_replay_reads_the_new_input

    check_graph_replay_reads_the_new_input(functools.partial(fp8_wgmma.fp8_wgmma, cfg=cfg), cfg.tokens, 4096, 4096)


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", EACH_KERNEL, ids=lambda c: c.kernel)
def test_logits_criterion_holds_with_the_wgmma_decode_gemm(cfg, tmp_path, monkeypatch):
    """Issue 3's criterion (test_gpu_engine.py) with the decode GEMMs on the kernel (batch 4
    decodes 36 rows, batch 1 nine; the 32-row tile takes 9), and the kernel seen to run."""
    pytest.importorskip("triton")
    from tests.engine.test_gpu_engine import test_real_fp8_logits_vs_emulation_on_the_warm_started_model as criterion

    calls = []
    real = fp8_wgmma.fp8_wgmma
    monkeypatch.setattr(fp8_wgmma, "fp8_wgmma", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(fp8_wgmma, "ENGINE_CONFIGS", {(1, cfg.tokens): cfg})
    criterion("dense", 4 if cfg.tokens == 64 else 1, tmp_path)
    assert calls


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", EACH_KERNEL, ids=lambda c: c.kernel)
def test_engine_decode_logprobs_match_a_full_forward_with_the_wgmma_decode_gemm(cfg, tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from tests.engine.test_gpu_engine import test_fp8_engine_decode_logprobs_match_a_full_forward_of_its_tokens as check

    monkeypatch.setattr(fp8_wgmma, "ENGINE_CONFIGS", {(1, cfg.tokens): cfg})
    check(tmp_path)


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", fp8_wgmma.SILU_VARIANTS, ids=lambda c: c.kernel)
def test_silu_twin_gives_the_bits_of_the_silu_kernel_then_the_gemm(cfg):
    """The down_proj twin computing bf16(silu(gate)) * up and its 1x128 quantization in its
    producer warps must equal silu_mul(quantize=True) followed by the plain kernel with the
    same splits, bit for bit (the sums are the same; so must the codes and scales be),
    over gate values up to ~+-400 (past exp's range), an all-zero group and batch rows
    below the tile."""
    from quantroll.formats import get_format
    from quantroll.kernels.fused import silu_mul

    plain = next(c for c in fp8_wgmma.VARIANTS if c.tokens == cfg.tokens)
    g = torch.Generator(device="cuda").manual_seed(cfg.tokens)
    for m, n, inter in ((cfg.tokens, 4096, 12288), (cfg.tokens // 2 + 1, 256, 384), (1, 128, 256)):
        gate = torch.randn(m, inter, device="cuda", generator=g) * torch.logspace(-3, 1.95, inter, device="cuda")
        up = torch.randn(m, inter, device="cuda", generator=g)
        up[:, -128:] = 0  # an all-zero group: scale 0
        gate_up = torch.cat([gate, up], dim=1).to(torch.bfloat16)
        wq = get_format("fp8").quantize_weight((torch.randn(n, inter, device="cuda", generator=g) * 0.02).to(torch.bfloat16))
        act = silu_mul(gate_up, quantize=True)
        for splits in (1, 3):
            y = fp8_wgmma.fp8_wgmma_silu(gate_up, wq.data, wq.scale, dataclasses.replace(cfg, splits=splits))
            ref = fp8_wgmma.fp8_wgmma(act.codes, act.scales, wq.data, wq.scale, dataclasses.replace(plain, splits=splits))
            assert torch.equal(y, ref), (m, n, inter, splits)


@hopper
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", fp8_wgmma.SILU_VARIANTS, ids=lambda c: c.kernel)
def test_silu_twin_codes_over_every_bf16_gate_value(cfg):
    """Through an identity weight (codes 1 on the diagonal, scales 1) each output is one
    code times its scale, so a wrong code, K position or scale shows: every BF16 bit
    pattern as gate (NaN, infinities and subnormals included), up from 2^-135 to 2^11, a
    group of subnormal values only, in order and shuffled, against the silu kernel + plain
    kernel (int16 views: NaN == NaN)."""
    from quantroll.kernels.fused import silu_mul

    plain = next(c for c in fp8_wgmma.VARIANTS if c.tokens == cfg.tokens)
    inter = 65536 // 16
    wq = torch.eye(inter, device="cuda").to(torch.float8_e4m3fn)
    ws = torch.ones(inter // 128, inter // 128, device="cuda")
    every = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(cfg.tokens)
    for gate in (every.view(16, inter), every[torch.randperm(65536, device="cuda", generator=g)].view(16, inter)):
        up = torch.exp2(torch.rand(16, inter, device="cuda", generator=g) * 146 - 135) * torch.sign(
            torch.randn(16, inter, device="cuda", generator=g))
        up[:, :128] = 1e-39  # with gate 1 below: a group of BF16 subnormals (silu(1) * 1e-39)
        gate = gate[: cfg.tokens].clone()
        gate[:, :128] = 1.0
        gate_up = torch.cat([gate, up[: cfg.tokens]], dim=1).to(torch.bfloat16).contiguous()
        act = silu_mul(gate_up, quantize=True)
        y = fp8_wgmma.fp8_wgmma_silu(gate_up, wq, ws, dataclasses.replace(cfg, splits=2))
        ref = fp8_wgmma.fp8_wgmma(act.codes, act.scales, wq, ws, dataclasses.replace(plain, splits=2))
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16))


@hopper
@pytest.mark.gpu
def test_engine_with_the_silu_twin_generates_the_same_bits():
    """An FP8 engine whose decode down_proj GEMMs compute silu * up themselves (no silu
    kernel) gives the tokens and logprobs, bit for bit, of one with the silu kernel and the
    same warpgroup GEMMs (random Qwen3-8B-shaped 2-layer model, 3 prompts)."""
    pytest.importorskip("triton")
    from tests.engine.switches import assert_same_generations, counting, engine_results_with

    twin = next(c for c in fp8_wgmma.SILU_VARIANTS if c.tokens == 16)
    plain = next(c for c in fp8_wgmma.VARIANTS if c.tokens == 16)
    gemms = ("fp8_wgmma", "ENGINE_CONFIGS", {(1, 16): plain})
    with counting(fp8_wgmma, "fp8_wgmma_silu") as calls:
        separate, fused = engine_results_with([[gemms], [gemms, ("fp8_wgmma", "ENGINE_SILU_CONFIGS", {(1, 16): twin})]])
    assert calls[0] > 0
    assert_same_generations(separate, fused)

"""The CUDA decode GEMM (kernels/cuda/fp8_gemv.cu): its variants, its build, and on a GPU
its outputs against float64 (each BF16 output float64's value rounded, up to float32
summation slack), run to run, under CUDA-graph replay, launched early or not, and in the
engine (issue 3's logits criterion with every decode GEMM on it)."""

import dataclasses
import re

import pytest
import torch

from quantroll.kernels import cuda_jit, fp8_gemv
from quantroll.kernels.choices import EngineKernels
from quantroll.kernels.gemm_plan import GemmPlan


def test_variants_list_matches_the_instances_in_the_source():
    source = (cuda_jit.SOURCE_DIR / fp8_gemv.SOURCE).read_text()
    found = re.findall(r"^QUANTROLL_FP8_GEMV\((\d+), (\d+), (\d+), (\d+), (\d+)\)", source, re.M)
    assert {tuple(map(int, m)) for m in found} == {(c.token_tiles, c.row_tiles, c.warps, c.unroll, c.pipeline)
                                                   for c in fp8_gemv.VARIANTS}
    assert len(found) == len(fp8_gemv.VARIANTS)
    assert set(fp8_gemv.CHOICE) == {(t, w) for t in (1, 2, 4, 8) for w in ("narrow", "wide")}
    for (needed, _), choice in fp8_gemv.CHOICE.items():
        cfg = fp8_gemv.GemvConfig(*choice)
        assert cfg.token_tiles >= needed and cfg in fp8_gemv.VARIANTS
        # the one-row-tile twin serves N that the chosen rows do not divide
        assert fp8_gemv.GemvConfig(*choice[:1], 1, *choice[2:]) in fp8_gemv.VARIANTS


def test_the_cuda_sources_ship_in_the_package():
    """nvcc compiles them on the user's machine, so a wheel must carry them (package-data)."""
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["quantroll"]
    sources = [p.relative_to(root / "quantroll").as_posix() for p in cuda_jit.SOURCE_DIR.iterdir() if p.is_file()]
    assert sources and all(any(fnmatch.fnmatch(s, pat) for pat in patterns) for s in sources)


def test_token_tiles_hold_the_batch():
    for m in range(1, 65):
        assert m <= 8 * fp8_gemv.token_tiles(m) < 2 * m + 8


def test_launch_structs_have_the_driver_layout():
    """CUlaunchAttribute and CUlaunchConfig as cuda.h lays them out on 64-bit hosts (an id
    padded to 8 bytes + a 64-byte value union; 7 uints, a stream, an attribute pointer, a
    count): a mismatch would hand cuLaunchKernelEx garbage."""
    import ctypes

    assert ctypes.sizeof(cuda_jit._LaunchAttribute) == 72
    assert cuda_jit._LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(cuda_jit._LaunchConfig) == 56
    assert (cuda_jit._LaunchConfig.stream.offset, cuda_jit._LaunchConfig.attrs.offset,
            cuda_jit._LaunchConfig.num_attrs.offset) == (32, 40, 48)


def _without_cuda_decode(kernels: EngineKernels) -> EngineKernels:
    rows = tuple(r for r in kernels.fp8_gemms.rows if r.kernel != "cuda decode")
    return dataclasses.replace(kernels, fp8_gemms=GemmPlan(rows))


def test_producers_release_only_for_the_cuda_gemm_on_a_gpu():
    kernels = EngineKernels()
    for producer in ("norm", "silu"):
        assert fp8_gemv.release_producers(torch.device("cpu"), producer, kernels) is False
    assert not fp8_gemv.release_producers(torch.device("cuda", 0), "norm", _without_cuda_decode(kernels))
    assert not fp8_gemv.release_producers(torch.device("cuda", 0), "norm",
                                          dataclasses.replace(kernels, early_launch=False))
    with pytest.raises(ValueError, match="unknown producer 'rope'"):
        fp8_gemv.release_producers(torch.device("cpu"), "rope", kernels)
    with pytest.raises(ValueError, match="unknown"):
        EngineKernels(releasing_producers=frozenset({"attention"}))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_producer_left_out_of_the_releasing_set_does_not_release():
    kernels = EngineKernels()
    if not fp8_gemv.release_producers(torch.device("cuda"), "silu", kernels):
        pytest.skip("no early release on this GPU (needs Hopper and the CUDA decode GEMM)")
    only_norm = dataclasses.replace(kernels, releasing_producers=frozenset({"norm"}))
    assert not fp8_gemv.release_producers(torch.device("cuda"), "silu", only_norm)
    assert fp8_gemv.release_producers(torch.device("cuda"), "norm", only_norm)


def test_cpu_tensors_never_take_the_cuda_kernel():
    """The interpreter tests run the engine's GPU branches on CPU tensors, also on GPU
    machines: those must stay on the Triton path without asking the GPU anything."""
    assert not fp8_gemv.usable(torch.device("cpu"))


def test_default_config_fits_every_batch_and_width():
    for m in range(1, 65):
        for n in (16, 48, 96, 4096, 6144):
            cfg = fp8_gemv.default_config(m, n, 4096)
            assert cfg in fp8_gemv.VARIANTS and 8 * cfg.token_tiles >= m and n % cfg.rows == 0


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("capability", [(8, 9), (9, 0)])
def test_source_builds_for_ada_and_hopper(capability, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTROLL_CACHE_DIR", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / fp8_gemv.SOURCE, capability)
    image = cubin.read_bytes()
    assert all(c.kernel.encode() in image for c in fp8_gemv.VARIANTS)
    assert cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / fp8_gemv.SOURCE, capability) == cubin  # cached
    assert [p.name for p in cubin.parent.iterdir()] == [cubin.name]  # no temporary left behind


def test_missing_nvcc_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_jit, "find_nvcc", lambda: None)
    with pytest.raises(cuda_jit.CompileError, match="nvcc not found: set CUDA_HOME or QUANTROLL_NVCC"):
        cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / fp8_gemv.SOURCE, (9, 0))


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_compile_failure_names_the_source_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTROLL_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "broken.cu"
    bad.write_text("__global__ void k() { this is not C++; }\n")
    with pytest.raises(cuda_jit.CompileError, match="nvcc failed on broken.cu"):
        cuda_jit.compile_cubin(bad, (9, 0))
    assert list((tmp_path / "cache" / "cuda").iterdir()) == []


gpu = pytest.mark.skipif(not torch.cuda.is_available() or cuda_jit.unavailable_reason() is not None,
                         reason="needs a CUDA GPU with FP8 conversions and nvcc")


def _operands(m, n, k, seed=0):
    from quantroll.formats import get_format
    from quantroll.kernels.fp8_linear import quantize_activation_fp8

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(m, k, device="cuda", generator=g) * torch.logspace(-2, 2, k, device="cuda")).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    aq, a_s = quantize_activation_fp8(x)
    return aq, a_s, get_format("fp8").quantize_weight(w)


def _excess_over_rounding(aq, a_s, wq, y) -> float:
    """excess_over_bf16_rounding on the dequantized FP8 operands."""
    from quantroll.formats import get_format
    from quantroll.bench.numerics import excess_over_bf16_rounding

    a = aq.double() * a_s.double().repeat_interleave(128, dim=1)[:, :aq.shape[1]]
    return excess_over_bf16_rounding(y, a, get_format("fp8").dequantize(wq).double())


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 16, 128), (5, 48, 384), (9, 272, 1152), (16, 4096, 4096), (17, 96, 256),
                                   (33, 1024, 12288), (64, 6144, 4096)])
def test_every_variant_rounds_the_float64_result(m, n, k):
    """Each variant rounds float64's product (up to float32 summation slack) and gives the
    same bits launched early or plainly."""
    aq, a_s, wq = _operands(m, n, k)
    for cfg in fp8_gemv.VARIANTS:
        if 8 * cfg.token_tiles < m or n % cfg.rows:
            continue
        y = fp8_gemv.fp8_gemv(aq, a_s, wq.data, wq.scale, cfg)
        assert _excess_over_rounding(aq, a_s, wq, y) <= 0, cfg
        assert torch.equal(y, fp8_gemv.fp8_gemv(aq, a_s, wq.data, wq.scale, cfg, early=False)), cfg


@gpu
@pytest.mark.gpu
def test_scales_in_either_layout_and_a_row_slice_of_the_codes():
    """The same bits for scales in either layout, and right on rows 2..9 of a larger
    activation (the row stride and the scale offset carry over)."""
    aq, a_s, wq = _operands(12, 256, 512)
    y = fp8_gemv.fp8_gemv(aq, a_s, wq.data, wq.scale)
    assert torch.equal(y, fp8_gemv.fp8_gemv(aq, a_s.contiguous(), wq.data, wq.scale))
    part = fp8_gemv.fp8_gemv(aq[2:10], a_s[2:10], wq.data, wq.scale)
    assert _excess_over_rounding(aq[2:10], a_s[2:10], wq, part) <= 0


@gpu
@pytest.mark.gpu
def test_graph_replay_after_a_kernel_that_writes_the_input():
    """Launched early inside a CUDA graph right after the kernel that writes its input, the
    GEMM must read the new input (griddepcontrol.wait), replay after replay."""
    m, n, k = 16, 4096, 4096
    aq, a_s, wq = _operands(m, n, k)
    src = aq.clone()
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        aq.copy_(src)
        fp8_gemv.fp8_gemv(aq, a_s, wq.data, wq.scale, out=out)
    for seed in range(3):
        fresh = _operands(m, n, k, seed=seed + 1)[0]
        src.copy_(fresh)
        aq.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fp8_gemv.fp8_gemv(fresh, a_s, wq.data, wq.scale, early=False))


@gpu
@pytest.mark.gpu
def test_fp8_gemm_takes_it_for_the_rows_the_table_gives_it(monkeypatch):
    from quantroll.kernels import fp8_linear

    calls = []
    real = fp8_gemv.fp8_gemv
    monkeypatch.setattr(fp8_gemv, "fp8_gemv", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    for m in (1, 16, 17, 100):
        aq, a_s, wq = _operands(m, 512, 512)
        fp8_linear.fp8_gemm(aq, a_s, wq.data, wq.scale)
    assert calls == [1, 16]
    aq, a_s, wq = _operands(8, 512, 512)
    fp8_linear.fp8_gemm(aq, a_s, wq.data, wq.scale, plan=_without_cuda_decode(EngineKernels()).fp8_gemms)
    assert calls == [1, 16]


@gpu
@pytest.mark.gpu
def test_early_launch_changes_no_bits_in_the_engine():
    """Launching the CUDA GEMM ahead of the kernel before it changes when work starts,
    never what it computes: the same tokens and logprobs, bit for bit, as ordinary
    launches (3 prompts, CUDA graphs)."""
    pytest.importorskip("triton")
    from tests.engine.switches import assert_same_generations, engine_results_by_kernels

    plain, early = engine_results_by_kernels([EngineKernels(early_launch=False), EngineKernels()])
    assert_same_generations(plain, early)

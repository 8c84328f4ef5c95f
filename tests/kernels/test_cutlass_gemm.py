"""The CUTLASS blockwise FP8 GEMMs (kernels/cutlass_gemm.py, cutlass_build.py,
cuda/cutlass_fp8_gemm.cu): the build at first use (its cache key, lock, temporary files, the
one-line reasons when nvcc or CUTLASS is missing) with a stand-in nvcc on the CPU, the config
list against the source, operand checks; on a Hopper GPU every config against float64 by the
numerics rule (<= 1.5x cuBLAS blockwise's error on the same operands, <= 2e-4 where cuBLAS
refuses), odd M, M = 1, every output element written, and CUDA graph capture."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest
import torch

from quantroll.kernels import cutlass_build, cutlass_gemm
from quantroll.kernels.cuda_jit import CompileError

FAKE_NVCC = """#!/bin/sh
# a stand-in nvcc: prints a version, writes the file after -o, logs each call
if [ "$1" = "--version" ]; then echo "fake nvcc {version}"; exit 0; fi
echo "$@" >> "{calls}"
{fail}
out=""
while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; fi; shift; done
echo "object" > "$out"
echo "ptxas info    : Used 100 registers" >&2
"""


def fake_nvcc(tmp_path: Path, version: str = "1", fail: bool = False) -> tuple[str, Path]:
    calls = tmp_path / f"calls-{version}-{fail}.txt"
    path = tmp_path / f"nvcc-{version}-{fail}"
    path.write_text(FAKE_NVCC.format(version=version, calls=calls,
                                     fail='echo "error: broken" >&2; exit 1' if fail else ""))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path), calls


def fake_headers(tmp_path: Path, minor: int = 2) -> list[Path]:
    root = tmp_path / f"include-{minor}"
    (root / "cutlass").mkdir(parents=True, exist_ok=True)
    (root / "cutlass" / "version.h").write_text(
        f"#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR {minor}\n#define CUTLASS_PATCH 0\n")
    return [root]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTROLL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("QUANTROLL_CUTLASS_LIB", raising=False)
    return tmp_path / "cache" / "cuda"


def test_cache_key_follows_source_flags_nvcc_and_cutlass_not_the_include_path(tmp_path, monkeypatch, cache):
    nvcc, _ = fake_nvcc(tmp_path)
    base = cutlass_build.build_plan(nvcc, fake_headers(tmp_path))
    assert base.library.name == f"cutlass_fp8_gemm-{base.key}.so" and base.library.parent == cache
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    assert cutlass_build.build_plan(nvcc, fake_headers(moved)).key == base.key  # a carried cache still hits
    assert cutlass_build.build_plan(fake_nvcc(tmp_path, "2")[0], fake_headers(tmp_path)).key != base.key
    assert cutlass_build.build_plan(nvcc, fake_headers(tmp_path, minor=3)).key != base.key
    flags = cutlass_build.FLAGS
    monkeypatch.setattr(cutlass_build, "FLAGS", flags + ("-lineinfo",))
    assert cutlass_build.build_plan(nvcc, fake_headers(tmp_path)).key != base.key
    monkeypatch.setattr(cutlass_build, "FLAGS", flags)
    source = tmp_path / "cutlass_fp8_gemm.cu"
    source.write_text(cutlass_build.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(cutlass_build, "SOURCE", source)
    assert cutlass_build.build_plan(nvcc, fake_headers(tmp_path)).key != base.key


def test_build_compiles_every_part_once_then_hits_the_cache(tmp_path, cache):
    nvcc, calls = fake_nvcc(tmp_path)
    plan = cutlass_build.build_plan(nvcc, fake_headers(tmp_path))
    assert len(plan.parts) == 1 + len(cutlass_build.OUT_TYPES) * len(cutlass_gemm.CONFIGS)
    library = cutlass_build.build(plan, jobs=2)
    lines = calls.read_text().splitlines()
    assert len(lines) == len(plan.parts) + 1  # the objects and the link
    assert sum("-shared" in line for line in lines) == 1
    assert all("-gencode=arch=compute_90a,code=sm_90a" in line for line in lines)
    assert all(f"-DQR_SOURCE_KEY=0x{cutlass_build.source_hash()}ULL" in line for line in lines if "-c" in line.split())
    assert library.read_text() == "object\n" and "ptxas info" in library.with_suffix(".log").read_text()
    assert sorted(p.name for p in cache.iterdir()) == sorted([library.name, library.with_suffix(".log").name,
                                                              "cutlass_fp8_gemm.lock"])  # no temporaries left
    assert cutlass_build.build(plan) == library
    assert len(calls.read_text().splitlines()) == len(lines)  # cached: nvcc not run again


def test_failed_build_names_the_part_and_leaves_nothing(tmp_path, cache):
    nvcc, _ = fake_nvcc(tmp_path, fail=True)
    plan = cutlass_build.build_plan(nvcc, fake_headers(tmp_path))
    with pytest.raises(CompileError, match=r"nvcc failed on cutlass_fp8_gemm.cu \(-DQR_PART=.*error: broken"):
        cutlass_build.build(plan, jobs=1)
    assert [p.name for p in cache.iterdir()] == ["cutlass_fp8_gemm.lock"]


def test_missing_nvcc_or_cutlass_is_a_one_line_reason(tmp_path, monkeypatch, cache):
    monkeypatch.setattr(cutlass_build, "find_nvcc", lambda: None)
    with pytest.raises(cutlass_build.CutlassUnavailable, match="^nvcc not found") as err:
        cutlass_build.load_library()
    assert "\n" not in str(err.value)
    monkeypatch.delenv("QUANTROLL_CUTLASS_INCLUDE", raising=False)
    monkeypatch.setattr(cutlass_build.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(cutlass_build.CutlassUnavailable, match="nvidia-cutlass package is not installed"):
        cutlass_build.build_plan(fake_nvcc(tmp_path)[0])
    monkeypatch.setenv("QUANTROLL_CUTLASS_INCLUDE", str(tmp_path / "nowhere"))
    with pytest.raises(cutlass_build.CutlassUnavailable, match="holds no cutlass/version.h"):
        cutlass_build.build_plan(fake_nvcc(tmp_path)[0])
    dirs = fake_headers(tmp_path, minor=5)
    monkeypatch.setenv("QUANTROLL_CUTLASS_INCLUDE", str(dirs[0]))
    assert cutlass_build.build_plan(fake_nvcc(tmp_path)[0]).includes == tuple(dirs)


def test_prebuilt_library_must_exist_and_match_the_source(tmp_path, monkeypatch, cache):
    monkeypatch.setenv("QUANTROLL_CUTLASS_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(cutlass_build.CutlassUnavailable, match="QUANTROLL_CUTLASS_LIB=.*is not a file"):
        cutlass_build.load_library()
    not_a_library = tmp_path / "junk.so"
    not_a_library.write_text("junk")
    monkeypatch.setenv("QUANTROLL_CUTLASS_LIB", str(not_a_library))
    with pytest.raises(OSError):  # cutlass_gemm.library() turns this into the unavailable reason
        cutlass_build.load_library()


def test_unavailable_reason_on_a_cpu_machine_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert cutlass_gemm.unavailable_reason() == "no CUDA device"
    assert cutlass_gemm.available() is False


def test_configs_match_the_source():
    """CONFIGS' tiles, swap and scheduler are those of the Config<id> specialisations."""
    text = cutlass_build.SOURCE.read_text()
    found = re.findall(r"struct Config<(\d+)>\s*:\s*Blockwise<Shape<_(\d+), _(\d+), _128>, (?:One|Shape<[^>]*>), "
                       r"(\w+), \w+, (\w+), (true|false), Out>", text)
    assert len(found) == len(cutlass_gemm.CONFIGS) == cutlass_build.num_configs()
    for cid, tile_m, tile_n, schedule, scheduler, swap in found:
        cfg = cutlass_gemm.CONFIGS[int(cid)]
        assert cfg.id == int(cid) and cfg.swap == (swap == "true")
        tokens, weights = (int(tile_n), int(tile_m)) if cfg.swap else (int(tile_m), int(tile_n))
        assert (cfg.token_tile, cfg.weight_tile) == (tokens, weights)
        assert cfg.stream_k == (scheduler == "StreamK")
    assert f"QR_EXTERN({len(cutlass_gemm.CONFIGS) - 1})" in text and f"QR_CASE({len(cutlass_gemm.CONFIGS) - 1})" in text
    assert cutlass_gemm.config("swap-128x16-sk").id == 0 and cutlass_gemm.config(5).name == "128x128-c1x2-sk"
    with pytest.raises(ValueError, match="unknown CUTLASS GEMM config 'nope'"):
        cutlass_gemm.config("nope")


def _operands(m, n, k, device="cpu"):
    from quantroll.kernels.fp8_activation import fp8_activation_buffers

    aq, a_s = fp8_activation_buffers(m, k, device)
    a_s.copy_(torch.rand(m, k // 128) + 0.5)
    wq = torch.zeros(n, k, dtype=torch.float8_e4m3fn, device=device)
    w_s = torch.ones(n // 128, k // 128, device=device)
    return aq, a_s, wq, w_s


def test_operand_checks_name_the_problem():
    aq, a_s, wq, w_s = _operands(8, 256, 512)
    with pytest.raises(ValueError, match="scales must be float32"):
        cutlass_gemm._check_operands(aq, a_s.double(), wq, w_s)
    with pytest.raises(ValueError, match="outer-dim-major"):
        cutlass_gemm._check_operands(aq, a_s.contiguous(), wq, w_s)
    with pytest.raises(ValueError, match="do not fit 1x128 activation and 128x128 weight scales"):
        cutlass_gemm._check_operands(aq, a_s, wq, w_s[:1])
    with pytest.raises(ValueError, match="one CUDA device"):
        cutlass_gemm._check_operands(aq, a_s, wq, w_s)


@pytest.mark.parametrize("m", [1, 3, 4, 5, 16, 33])
def test_scales_padded_only_where_tma_needs_it(m):
    _, a_s, _, _ = _operands(m, 256, 512)
    for cfg in cutlass_gemm.CONFIGS:
        scales, ld, rows = cutlass_gemm._scales(a_s, cfg)
        if cfg.tma_scales and m % 4:
            assert (ld, rows) == (-(-m // 4) * 4,) * 2 and scales.shape == (4, rows)
            assert torch.equal(scales[:, :m], a_s.t()) and bool((scales[:, m:] == 1).all())
        else:
            assert scales is a_s and rows == m and ld == (m if m > 1 else 1)


def _built_library():
    """The real library when one is at hand without building (QUANTROLL_CUTLASS_LIB), else skip."""
    import os

    if not os.environ.get("QUANTROLL_CUTLASS_LIB"):
        pytest.skip("set QUANTROLL_CUTLASS_LIB to a built library (bench/build_cutlass_gemm.py --out DIR)")
    return cutlass_build.load_library()


@pytest.mark.parametrize("cfg", cutlass_gemm.CONFIGS, ids=lambda c: c.name)
def test_built_library_accepts_the_engine_shapes_and_refuses_misaligned_ones(cfg):
    """CUTLASS's can_implement, no GPU needed: the 8B and 1.7B layer shapes at decode and
    prefill M run on every config (scales of an odd M counted padded, as the wrapper pads
    them); a K that is not 16-byte aligned, unpadded odd-M scales on a TMA-scale config and
    an unknown config are refused with a named status. (Loading the library on a CPU found
    a SIGFPE here once: the workspace query divided by a placeholder SM count.)"""
    lib = _built_library()
    assert lib.lib.qr_cutlass_num_configs() == len(cutlass_gemm.CONFIGS)

    def verdict(m, n, k, rows=None, out=0, config_id=cfg.id):
        rows = rows if rows is not None else (-(-m // 4) * 4 if cfg.tma_scales and m % 4 else m)
        args = cutlass_gemm._problem(cfg, out, m, n, k, 4096, 4096, rows, rows, 4096, 4096, 4096, 0, 0)
        return lib.lib.qr_cutlass_can_implement(config_id, *args[1:])

    for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (4096, 2048), (2048, 2048),
                 (12288, 2048), (2048, 6144)):
        for m in (1, 5, 16, 33, 64, 100, 256, 1024):
            assert verdict(m, n, k) == 0, (m, n, k)
            assert verdict(m, n, k, out=1) == 0, (m, n, k)
    assert lib.status_string(verdict(16, 4096, 2040)).startswith("refused by CUTLASS's can_implement")
    if cfg.tma_scales:
        assert lib.status_string(verdict(5, 4096, 4096, rows=5)) == "Error Misaligned Operand"
    assert lib.status_string(verdict(16, 4096, 4096, config_id=len(cutlass_gemm.CONFIGS))) == "unknown config id"
    assert lib.status_string(verdict(16, 4096, 4096, out=2)) == "unknown config id"


# ---------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu
needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or cutlass_gemm.unavailable_reason() is not None,
                                  reason="needs an sm_90 GPU with the CUTLASS library (built or prebuilt)")


def _gpu_case(m, n, k, seed=0):
    from quantroll.bench.gemm_case import gemm_case

    torch.manual_seed(seed)
    return gemm_case(m, n, k, copies=1)


def _limit(case, m, n, k):
    from quantroll.kernels.scaled_mm import fp8_gemm_scaled_mm, scaled_mm_supports

    if not scaled_mm_supports(m, n, k):
        return 2e-4
    w = case.quantized[0]
    return 1.5 * case.err(fp8_gemm_scaled_mm(case.aq, case.a_s, w.data, w.scale, torch.float32))


@gpu
@needs_hopper
@pytest.mark.parametrize("cfg", cutlass_gemm.CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("m,n,k", [(1, 1024, 2048), (5, 2048, 2048), (16, 4096, 4096), (33, 6144, 4096),
                                   (100, 2048, 6144), (256, 4096, 12288)])
def test_config_meets_the_numerics_rule(cfg, m, n, k):
    case = _gpu_case(m, n, k)
    w = case.quantized[0]
    limit = _limit(case, m, n, k)
    for splits in ((0, 1, 3) if cfg.stream_k else (0,)):
        for out_dtype in (torch.float32, torch.bfloat16):
            poisoned = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
            y = cutlass_gemm.cutlass_fp8_gemm(case.aq, case.a_s, w.data, w.scale, out_dtype, cfg, splits, out=poisoned)
            assert y is poisoned
            assert bool(torch.isfinite(y).all()), f"{cfg.name} splits {splits}: unwritten or NaN outputs"
            err = case.err(y)
            bound = limit if out_dtype == torch.float32 else 4e-3  # bf16 rounding (2^-9 relative) dominates
            assert err <= bound, f"{cfg.name} M={m} N={n} K={k} splits {splits} {out_dtype}: {err:.3e} > {bound:.3e}"


@gpu
@needs_hopper
@pytest.mark.parametrize("cfg", cutlass_gemm.CONFIGS, ids=lambda c: c.name)
def test_graph_replay_matches_eager(cfg):
    m, n, k = 21, 2048, 2048  # odd M: the scale padding of TMA-scale configs is captured too
    case = _gpu_case(m, n, k, seed=1)
    w = case.quantized[0]
    eager = cutlass_gemm.cutlass_fp8_gemm(case.aq, case.a_s, w.data, w.scale, torch.bfloat16, cfg)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cutlass_gemm.cutlass_fp8_gemm(case.aq, case.a_s, w.data, w.scale, torch.bfloat16, cfg)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = cutlass_gemm.cutlass_fp8_gemm(case.aq, case.a_s, w.data, w.scale, torch.bfloat16, cfg)
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager)


@gpu
@needs_hopper
@pytest.mark.parametrize("cfg", cutlass_gemm.CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("m", [16, 48, 200])
def test_early_launch_reads_what_the_releasing_norm_wrote(cfg, m):
    """The engine's pattern: the fused RMSNorm quantizes the activation and releases its
    dependents at its start (griddepcontrol.launch_dependents); the GEMM launched early
    (programmatic dependent launch) must still read the codes and scales the norm wrote: bit
    for bit the ordinary launch's output, eagerly and replayed from a CUDA graph."""
    from quantroll.kernels.fused import add_rmsnorm

    hidden, n = 4096, 6144
    torch.manual_seed(m)
    x = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
    weight = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    w = _gpu_case(8, n, hidden, seed=3).quantized[0]

    def step(early: bool):
        _, act = add_rmsnorm(x, None, weight, 1e-6, quantize=True)
        return cutlass_gemm.cutlass_fp8_gemm(act.codes, act.scales, w.data, w.scale, torch.bfloat16, cfg, early=early)

    ordinary = step(False)
    assert torch.equal(step(True), ordinary)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step(True)
    for _ in range(3):
        y.fill_(float("nan"))
        x.mul_(-1)  # new inputs each replay: a read of the previous replay's codes would show
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, step(False))


@gpu
@needs_hopper
def test_a_refused_shape_raises_with_cutlass_status():
    case = _gpu_case(16, 256, 2048)
    w = case.quantized[0]
    codes = torch.zeros(16, 2056, dtype=torch.float8_e4m3fn, device="cuda")[:, :2040]  # K not 16-byte aligned
    scales = torch.ones(16, 16, device="cuda").t().contiguous().t()
    with pytest.raises(cutlass_gemm.CutlassGemmError, match=r"swap-128x16-sk on M=16 N=256 K=2040.*refused by CUTLASS"):
        cutlass_gemm.cutlass_fp8_gemm(codes, scales, w.data[:, :2040], w.scale, torch.bfloat16, 0)

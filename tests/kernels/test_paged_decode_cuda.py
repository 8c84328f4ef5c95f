"""The CUDA FP8-cache decode attention (kernels/paged_decode_cuda.py, cuda/paged_decode_fp8.cu)
on a CPU machine: its source builds for Ada and Hopper where nvcc is installed (no spills),
the caches it refuses name the reason, and a decode_kernel that is neither Triton nor CUDA is
refused. Its numerics and graph capture run on the device: test_paged_attention_gpu.py."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import pytest
import torch

from quantroll.bench.shapes import shape_config
from quantroll.engine.paged_cache import PagedKVCache
from quantroll.kernels import cuda_jit, paged_attention, paged_decode_cuda


def _cache(kv_dtype="fp8_e4m3", heads=32, kv_heads=8, head_dim=128, block_size=16):
    cfg = dataclasses.replace(shape_config("qwen3-8b", 1), num_attention_heads=heads, num_key_value_heads=kv_heads,
                              head_dim=head_dim)
    return PagedKVCache(cfg, 4, block_size, torch.bfloat16, kv_dtype, "cpu", gpu_kernels=False)


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("capability", [(8, 9), (9, 0)])
def test_source_builds_for_ada_and_hopper_without_spills(capability, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTROLL_CACHE_DIR", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / paged_decode_cuda.SOURCE, capability)
    image = cubin.read_bytes()
    assert all(f"paged_decode_fp8_w{w}".encode() in image for w in paged_decode_cuda.WARPS)
    arch = f"sm_{capability[0]}{capability[1]}" + ("a" if capability == (9, 0) else "")
    done = subprocess.run([cuda_jit.find_nvcc(), "-cubin", "-O3", "-std=c++17", f"-arch={arch}", "-Xptxas=-v",
                           f"-I{cuda_jit.SOURCE_DIR}", "-o", str(tmp_path / "check.cubin"),
                           str(cuda_jit.SOURCE_DIR / paged_decode_cuda.SOURCE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores", done.stderr)
    assert spills and all(s == "0" for s in spills), done.stderr  # registers only: a spill would cost bandwidth
    # three blocks of 4 warps fit an SM: 168 registers or fewer, stages within a third of 228 KB
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", done.stderr)]
    assert regs and max(regs) <= 168, regs
    assert 3 * paged_decode_cuda.shared_bytes(4) <= 228 * 1024


def test_unsupported_caches_name_the_reason():
    q = torch.zeros(2, 32, 128, dtype=torch.bfloat16)
    reason = paged_decode_cuda.cache_unsupported_reason
    assert "FP8" in reason(_cache("bf16"), q)
    assert "head_dim 128" in reason(_cache(head_dim=64), torch.zeros(2, 32, 64, dtype=torch.bfloat16))
    assert "blocks of 16" in reason(_cache(block_size=32), q)
    assert "up to 16 query heads" in reason(_cache(heads=64, kv_heads=2), torch.zeros(2, 64, 128, dtype=torch.bfloat16))
    assert "BF16 queries" in reason(_cache(), q.float())
    assert "contiguous heads" in reason(_cache(), torch.zeros(2, 128, 32, dtype=torch.bfloat16).transpose(1, 2))
    assert "CUDA device" in reason(_cache(), q)  # everything else fits: the device
    # the engine asks before any cache exists, from the model's facts: groups of 6 and 7 fit
    for heads, kv_heads in ((28, 4), (12, 2), (64, 4)):
        assert "CUDA device" in paged_decode_cuda.unsupported_reason(
            kv_cache_dtype="fp8_e4m3", head_dim=128, block_size=16, heads=heads, kv_heads=kv_heads,
            dtype=torch.bfloat16, device=torch.device("cpu"))


def test_decode_kernel_is_triton_or_cuda():
    with pytest.raises(ValueError, match="decode_kernel must be 'triton' or 'cuda'"):
        paged_attention.PagedTiles(decode_kernel="flash")
    with pytest.raises(ValueError, match="the Triton kernel takes a warp count"):
        paged_attention.PagedTiles(decode_warps=None)
    paged_attention.PagedTiles(decode_kernel="cuda", decode_warps=None)  # the CUDA kernel's rule


# the H100's block slots of the compiled kernel (132 SMs; 167 registers: 3 blocks of 4 warps, 6 of 2)
H100_SLOTS = {4: 132 * 3, 2: 132 * 6}


@pytest.mark.parametrize("programs,warps", [(256, 4), (512, 2), (1024, 4), (2048, 2)],
                         ids=["16x8x2splits", "64x8", "128x8", "256x8"])
def test_warps_by_waves_pick_the_h100_sweeps_best(programs, warps):
    """The 8B sweep on an H100 (2026-12-06, docs/PERFORMANCE.md): 16 sequences in 2 splits
    fastest at 4 warps (34.2 us against 34.4), 64 at 2 (106 against 115), 128 at 4 (206
    against 216), 256 a tie (208.0 / 207.5). Hand-worked: 1024 programs fill 1024 / (396 x 3)
    = 86% of 4 warps' slots and 1024 / (792 x 2) = 65% of 2 warps'."""
    assert paged_decode_cuda.choose_warps(programs, H100_SLOTS) == warps


def test_wave_efficiency_by_hand():
    assert paged_decode_cuda.wave_efficiency(396, 396) == 1.0
    assert paged_decode_cuda.wave_efficiency(397, 396) == 397 / 792
    assert paged_decode_cuda.wave_efficiency(1024, 396) == 1024 / 1188
    assert paged_decode_cuda.choose_warps(100, {4: 100, 2: 200}) == 4  # one full wave beats half a wave
    assert paged_decode_cuda.choose_warps(200, {4: 100, 2: 200}) == 2  # both full: the fewer warps


def test_engine_takes_the_triton_tiles_where_the_cuda_kernel_cannot_serve():
    """The fallback resolve_attention applies (it asks the device only on a CUDA machine):
    only the FP8 cache's decode changes, and to the Triton tiles the choices name."""
    from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS

    moved = DEFAULT_ENGINE_KERNELS.without_cuda_attention()
    assert moved.attention_fp8 == DEFAULT_ENGINE_KERNELS.attention_fp8_triton
    assert moved.attention_fp8.decode_kernel == "triton" and moved.attention_fp8.decode_warps == 4
    assert dataclasses.replace(moved, attention_fp8=DEFAULT_ENGINE_KERNELS.attention_fp8) == DEFAULT_ENGINE_KERNELS
    with pytest.raises(ValueError, match="must be Triton tiles"):
        dataclasses.replace(DEFAULT_ENGINE_KERNELS, attention_fp8_triton=DEFAULT_ENGINE_KERNELS.attention_fp8)


def test_launch_passes_every_kernel_parameter_in_order(monkeypatch):
    """The launcher's argument list against the kernel's C signature (parsed from the source):
    the same count, pointers where the kernel takes pointers (a tensor or 0), integers where it
    takes long long. A mismatch would only show on the device, as garbage."""
    source = (cuda_jit.SOURCE_DIR / paged_decode_cuda.SOURCE).read_text()
    signature = re.search(r"paged_decode_fp8_w##WARPS\((.*?)\)\s*\{", source, re.S).group(1)
    params = [p.replace("\\", " ").split()[-1] for p in signature.split(",")]
    pointer = ["*" in p for p in signature.replace("\\", " ").split(",")]
    launched = {}

    class Module:
        def launch(self, name, grid, block, *args, shared_bytes=0):
            launched.update(name=name, grid=grid, block=block, args=args, shared=shared_bytes)

    monkeypatch.setattr(cuda_jit, "load", lambda source_name, device: Module())
    b, h, hkv = 3, 32, 8
    q = torch.zeros(b, h, 128, dtype=torch.bfloat16)
    k = torch.zeros(4, 16, hkv, 128, dtype=torch.uint8)
    v = torch.zeros(4, hkv, 128, 16, dtype=torch.uint8)
    ks, vs = torch.zeros(4, hkv, 16), torch.zeros(4, hkv, 16)
    tables, lengths = torch.zeros(b, 2, dtype=torch.int32), torch.ones(b, dtype=torch.int32)
    out = torch.zeros_like(q)
    for codes, splits in ((None, 1), (torch.zeros(b, h * 128, dtype=torch.uint8), 1), (None, 3)):
        scales = None if codes is None else torch.zeros(b, h)
        paged_decode_cuda.decode_fp8(q, k, v, ks, vs, tables, lengths, out, out, out, splits, warps=2, codes=codes,
                                     code_scales=scales)
        args = launched["args"]
        assert launched["name"] == "paged_decode_fp8_w2" and launched["grid"] == (b, hkv, splits)
        assert len(args) == len(params), (len(args), params)
        for name, is_pointer, arg in zip(params, pointer, args):
            if is_pointer:
                assert isinstance(arg, torch.Tensor) or arg == 0, (name, arg)
            else:
                assert isinstance(arg, int), (name, arg)
        assert args[params.index("group")] == h // hkv and args[params.index("splits")] == splits
        assert (args[params.index("codes")] is codes) if codes is not None else args[params.index("codes")] == 0
    with pytest.raises(ValueError, match="quantizes its output in one split only"):  # the merge quantizes splits
        paged_decode_cuda.decode_fp8(q, k, v, ks, vs, tables, lengths, out, out, out, 2, warps=2,
                                     codes=torch.zeros(b, h * 128, dtype=torch.uint8), code_scales=torch.zeros(b, h))
    assert launched["shared"] == paged_decode_cuda.shared_bytes(2)


def test_resolve_attention_falls_back_with_the_reason(monkeypatch):
    """engine/plan.resolve_attention where the GPU kernels serve (forced here; the device
    checks then answer as a machine without CUDA does): an FP8 cache whose model the CUDA
    kernel cannot serve, or a machine it cannot run on, gets the Triton tiles and the reason;
    a BF16 cache and an explicit Triton choice are left as they are."""
    from quantroll.engine import plan
    from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS
    from quantroll.model.kernel_config import DEFAULT_KERNELS

    from quantroll.kernels import paged_decode_cuda

    monkeypatch.setattr(plan, "runs_gpu_kernels", lambda device, kernels: True)
    # a machine the kernel cannot run on: this one without CUDA, or (on a GPU) a build that fails
    failed_build = "nvcc failed (stand-in)"
    monkeypatch.setattr(paged_decode_cuda, "build_reason", lambda device: failed_build)
    machine = failed_build if torch.cuda.is_available() else "no CUDA device"
    cfg = shape_config("qwen3-8b", 1)
    cuda = torch.device("cuda")
    for config, why in ((dataclasses.replace(cfg, head_dim=64), "compiled for head_dim 128, the cache has 64"),
                        (cfg, machine)):
        kernels, reason = plan.resolve_attention(DEFAULT_KERNELS, config, "fp8_e4m3", 16, torch.bfloat16, cuda)
        assert why in reason and kernels.gpu == DEFAULT_ENGINE_KERNELS.without_cuda_attention()
        said = plan.describe_attention(plan.engine_plan(kernels, config, None, cuda, fp8_kernels=None,
                                                        fused_kernels=True), cuda, "fp8_e4m3", reason)
        assert "Triton decode tiles of 128 keys" in said and f"cannot serve: {reason}" in said
    said = plan.describe_attention(plan.engine_plan(DEFAULT_KERNELS, cfg, None, cuda, fp8_kernels=None,
                                                    fused_kernels=True), cuda, "fp8_e4m3")
    assert "the CUDA FP8-cache kernel" in said and "2 or 4 warps by its waves" in said
    kernels, reason = plan.resolve_attention(DEFAULT_KERNELS, cfg, "fp8_e4m3", 32, torch.bfloat16, cuda)
    assert "blocks of 16" in reason
    assert plan.resolve_attention(DEFAULT_KERNELS, cfg, "bf16", 16, torch.bfloat16, cuda) == (DEFAULT_KERNELS, None)
    triton = dataclasses.replace(DEFAULT_KERNELS, gpu=DEFAULT_ENGINE_KERNELS.without_cuda_attention())
    assert plan.resolve_attention(triton, cfg, "fp8_e4m3", 16, torch.bfloat16, cuda) == (triton, None)

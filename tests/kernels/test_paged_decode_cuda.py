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
    assert "FP8" in paged_decode_cuda.unsupported_reason(_cache("bf16"), q)
    assert "head_dim 128" in paged_decode_cuda.unsupported_reason(_cache(head_dim=64), torch.zeros(2, 32, 64,
                                                                                                    dtype=torch.bfloat16))
    assert "blocks of 16" in paged_decode_cuda.unsupported_reason(_cache(block_size=32), q)
    assert "up to 16 query heads" in paged_decode_cuda.unsupported_reason(_cache(heads=64, kv_heads=2),
                                                                           torch.zeros(2, 64, 128,
                                                                                       dtype=torch.bfloat16))
    assert "BF16 queries" in paged_decode_cuda.unsupported_reason(_cache(), q.float())
    assert "CUDA device" in paged_decode_cuda.unsupported_reason(_cache(), q)  # everything else fits: the device


def test_decode_kernel_is_triton_or_cuda():
    with pytest.raises(ValueError, match="decode_kernel must be 'triton' or 'cuda'"):
        paged_attention.PagedTiles(decode_kernel="flash")


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
    for codes in (None, torch.zeros(b, h * 128, dtype=torch.uint8)):
        scales = None if codes is None else torch.zeros(b, h)
        paged_decode_cuda.decode_fp8(q, k, v, ks, vs, tables, lengths, out, out, out, 1, warps=2, codes=codes,
                                     code_scales=scales)
        args = launched["args"]
        assert launched["name"] == "paged_decode_fp8_w2" and launched["grid"] == (b, hkv, 1)
        assert len(args) == len(params), (len(args), params)
        for name, is_pointer, arg in zip(params, pointer, args):
            if is_pointer:
                assert isinstance(arg, torch.Tensor) or arg == 0, (name, arg)
            else:
                assert isinstance(arg, int), (name, arg)
        assert args[params.index("group")] == h // hkv and args[params.index("splits")] == 1
    assert launched["shared"] == paged_decode_cuda.shared_bytes(2)

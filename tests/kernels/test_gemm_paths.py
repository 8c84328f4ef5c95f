"""Which FP8 GEMM a product takes (fp8_linear.gemm_path), decided without a GPU: cuBLAS'
blockwise GEMM only where it was verified (Hopper, torch >= 2.9, shapes that cuBLAS
computed right), the Triton prefill GEMM everywhere else."""

import pytest
import torch

from quantroll.kernels import fp8_gemv, fp8_linear


@pytest.fixture
def gpu(monkeypatch):
    """A pretend CUDA device of the given capability under the given torch version."""
    def make(capability, version="2.11.0+cu128"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch, "__version__", version)
        monkeypatch.setattr(fp8_gemv, "usable", lambda device: False)  # no nvcc question here
        return torch.device("cuda", 0)
    return make


def test_cublas_takes_prefill_only_on_hopper_with_torch_2_9_or_newer(gpu):
    shape = (4096, 4096, 4096)
    assert fp8_linear.gemm_path(*shape, gpu((9, 0))) == "cublas"
    assert fp8_linear.gemm_path(*shape, gpu((9, 0), "2.9.1")) == "cublas"
    assert fp8_linear.gemm_path(*shape, gpu((9, 0), "2.8.0+cu126")) == "triton prefill"  # no blockwise scaling
    assert fp8_linear.gemm_path(*shape, gpu((8, 9))) == "triton prefill"  # Ada: not implemented by cuBLAS here
    assert fp8_linear.gemm_path(*shape, gpu((10, 0))) == "triton prefill"  # Blackwell: not verified
    assert fp8_linear.gemm_path(4096, 384, 4096, gpu((9, 0))) == "triton prefill"  # 3 scale blocks: wrong columns


def test_small_batches_stay_on_the_decode_kernels(gpu):
    device = gpu((9, 0))
    assert fp8_linear.gemm_path(64, 4096, 4096, device) == "triton decode"
    assert fp8_linear.gemm_path(65, 4096, 4096, device) == "cublas"


def test_cpu_devices_never_take_cublas():
    assert not fp8_linear.scaled_mm_verified_on(torch.device("cpu"))

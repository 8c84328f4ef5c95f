"""cuBLAS' blockwise FP8 GEMM (torch._scaled_mm with 1x128 activation and 128x128 weight
scales): where it was verified to run and compute right, and how it is called. The
prefill path of fp8_linear.gemm_path; accumulation narrower than the Triton GEMMs' (~1e-4
relative to float64, see fp8_linear)."""

from __future__ import annotations

import torch


def scaled_mm_supports(m: int, n: int, k: int) -> bool:
    """Shapes on which cuBLAS' blockwise FP8 GEMM was verified on the H200 (torch 2.11):
    128x128 weight-scale grids whose both sides are multiples of 4 blocks. With N = 384
    (3 blocks) it returned garbage in the last columns, silently."""
    return m >= 16 and n % 512 == 0 and k % 512 == 0


# cuBLAS' blockwise FP8 GEMM (torch 2.11, H200) refuses M that is not a multiple of 4
# (CUBLAS_STATUS_NOT_SUPPORTED from the heuristic query, or "Invalid scaling configuration"
# for scales with a padded leading dimension): the outer-dim-major 1x128 scales need their
# M side 16-byte aligned. Such M run on rows padded to a multiple of 4 (codes 0, scales 1).
SCALED_MM_ROWS = 4


def fp8_gemm_scaled_mm(aq, a_s, wq, w_s, out_dtype=torch.bfloat16) -> torch.Tensor:
    """torch._scaled_mm with 1x128 activation and 128x128 weight scales; M that cuBLAS
    refuses (not a multiple of ``SCALED_MM_ROWS``) on rows padded up to one, cut back after."""
    m = aq.shape[0]
    if m % SCALED_MM_ROWS:
        from quantroll.kernels.fp8_activation import fp8_activation_buffers

        padded = -(-m // SCALED_MM_ROWS) * SCALED_MM_ROWS
        codes, scales = fp8_activation_buffers(padded, aq.shape[1], aq.device)
        codes[m:].zero_()
        codes[:m].copy_(aq)
        scales[m:].fill_(1.0)
        scales[:m].copy_(a_s)
        return fp8_gemm_scaled_mm(codes, scales, wq, w_s, out_dtype)[:m]
    return torch._scaled_mm(aq, wq.t(), scale_a=a_s, scale_b=w_s.t(), out_dtype=out_dtype)


def scaled_mm_verified_on(device: torch.device) -> bool:
    """Whether torch._scaled_mm's 1x128 / 128x128 blockwise FP8 GEMM runs on ``device``
    as measured: Hopper (sm_90, where cuBLAS implements this scaling; measured on the
    H200) with torch >= 2.9 (earlier versions have no blockwise scaling). Elsewhere (Ada
    sm_89, Blackwell, older torch) prefill takes the Triton GEMM: correct everywhere,
    slower than cuBLAS on Hopper."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return version >= (2, 9) and torch.cuda.get_device_capability(device)[0] == 9

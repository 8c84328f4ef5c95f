"""The block-FP8 linear layer on Hopper: activation quantization + FP8 GEMM.

Two GEMM paths compute the same function, (a_q * a_s) @ (w_q * w_s)^T with 1x128
activation and 128x128 weight scales, and differ only in accumulation order:

- ``scaled_mm``: torch._scaled_mm with blockwise scales (cuBLAS; torch >= 2.9 and
  CUDA >= 12.9; K and N multiples of 128). cuBLAS refuses M = 1 and is barely faster
  than BF16 for small M.
- ``triton``: quantroll's Triton kernel, any shape, with split-K for small M so that a
  decode step reads the FP8 weights at full bandwidth. The activation is quantized by
  its own small kernel once per call; the kernel can also quantize it per tile
  (``a_s=None``), which is one launch fewer but redoes the work for every column tile
  and measured 2-7x slower at M = 64.

``Fp8LinearConfig`` picks per call; ``fp8_linear_forward`` is the QLinear backend
("fp8") registered when a CUDA device with FP8 tensor cores (sm_89+) is present.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantroll.model.linear import BACKENDS


@dataclass(frozen=True)
class TritonGemmConfig:
    block_m: int = 16
    block_n: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    # FP8 products accumulated in the tensor core's reduced-precision accumulator before
    # promotion to float32 (Triton's Hopper default never promotes; 32 = every instruction)
    imprecise_acc: int = 32


@dataclass(frozen=True)
class Fp8LinearConfig:
    """Which GEMM serves which M: Triton below ``scaled_mm_min_m`` rows, cuBLAS above."""

    scaled_mm_min_m: int = 65
    small_m: TritonGemmConfig = TritonGemmConfig()
    large_m: TritonGemmConfig = TritonGemmConfig(block_m=64, block_n=128, split_k=1, num_warps=8, num_stages=3)


CONFIG = Fp8LinearConfig()


@dataclass(frozen=True)
class Fp8Activation:
    """A BF16 activation that the kernel producing it (RMSNorm, silu*up) already quantized
    per 1x128 group, bit-identical to ``quantize_activation_fp8`` on the BF16 values: the
    FP8 linear that consumes it skips its own quantization launch. ``shape`` and ``dtype``
    are those of the BF16 tensor it stands for."""

    codes: torch.Tensor  # [M, K] float8_e4m3fn
    scales: torch.Tensor  # [M, ceil(K/128)] float32, outer-dim-major (stride (1, M))
    shape: torch.Size
    dtype: torch.dtype


def quantize_activation_fp8(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [M, K] e4m3, scales [M, ceil(K/128)] float32, outer-dim-major)."""
    from quantroll.kernels.fp8_gemm_triton import act_quant_fp8_kernel

    m, k = x2d.shape
    groups = (k + 127) // 128
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x2d.device)
    s = torch.empty(groups, m, dtype=torch.float32, device=x2d.device).t()
    if m:
        act_quant_fp8_kernel[(m, groups)](x2d, q, s, k, x2d.stride(0), q.stride(0), s.stride(0), s.stride(1), BLOCK=128)
    return q, s


def small_m_config(n: int, k: int, m: int = 16) -> TritonGemmConfig:
    """Decode tiles, measured on the H200 over Qwen3-8B's layer shapes at M = 1, 16, 64
    (bench/gemm_small_m.py, docs/PERFORMANCE.md): one row block for all of M, so each
    weight tile is read once; narrow column tiles, and split-K until there are >= 384
    programs (~3 per multiprocessor) to stream the weights. Up to M = 16 the FP8 products
    are promoted to float32 every 32 (as fast as 128 there); above, every 128, the
    DeepSeek-V3 interval, which the wider M tiles need to keep up with the weight stream."""
    small = m <= 16
    block_n = 32 if small else 64
    tiles = (n + block_n - 1) // block_n
    k_blocks = (k + 127) // 128
    split = 1
    while tiles * split < 384 and split < 4 and k_blocks // (split * 2) >= 2:
        split *= 2
    return TritonGemmConfig(block_m=16 if small else 64, block_n=block_n, split_k=split, num_warps=4, num_stages=4,
                            imprecise_acc=32 if small else 128)


def fp8_gemm_triton(aq, a_s, wq, w_s, out_dtype=torch.bfloat16, cfg: TritonGemmConfig | None = None) -> torch.Tensor:
    """FP8 GEMM; with ``a_s`` None, ``aq`` is the BF16 activation, quantized inside the kernel."""
    from quantroll.kernels.fp8_gemm_triton import fp8_block_gemm_kernel, splitk_reduce_kernel

    m, k = aq.shape
    n = wq.shape[0]
    cfg = cfg or (small_m_config(n, k, m) if m <= 64 else CONFIG.large_m)
    quant_a = a_s is None
    if quant_a:
        a_s = aq  # unused by the kernel
    k_blocks = (k + 127) // 128
    split = max(1, min(cfg.split_k, k_blocks))
    per_split = (k_blocks + split - 1) // split
    split = (k_blocks + per_split - 1) // per_split
    out = torch.empty(split, m, n, dtype=torch.float32 if split > 1 else out_dtype, device=aq.device)
    grid = ((n + cfg.block_n - 1) // cfg.block_n, (m + cfg.block_m - 1) // cfg.block_m, split)
    fp8_block_gemm_kernel[grid](
        aq, a_s, wq, w_s, out, m, n, k,
        aq.stride(0), aq.stride(1), a_s.stride(0), a_s.stride(1), wq.stride(0), wq.stride(1),
        w_s.stride(0), w_s.stride(1), out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=128, K_BLOCKS_PER_SPLIT=per_split,
        IMPRECISE_ACC=cfg.imprecise_acc, QUANT_A=quant_a,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split == 1:
        return out[0]
    y = torch.empty(m, n, dtype=out_dtype, device=aq.device)
    block = 1024
    splitk_reduce_kernel[((m * n + block - 1) // block,)](out, y, m * n, SPLIT=split, BLOCK=block, num_warps=4)
    return y


def scaled_mm_supports(m: int, n: int, k: int) -> bool:
    """Shapes on which cuBLAS' blockwise FP8 GEMM was verified on the H200 (torch 2.11):
    128x128 weight-scale grids whose both sides are multiples of 4 blocks. With N = 384
    (3 blocks) it returned garbage in the last columns, silently."""
    return m >= 16 and n % 512 == 0 and k % 512 == 0


def fp8_gemm_scaled_mm(aq, a_s, wq, w_s, out_dtype=torch.bfloat16) -> torch.Tensor:
    return torch._scaled_mm(aq, wq.t(), scale_a=a_s, scale_b=w_s.t(), out_dtype=out_dtype)


def fp8_linear_forward(layer, x: torch.Tensor) -> torch.Tensor:
    """QLinear backend: real FP8 GEMMs on the layer's block-FP8 buffers."""
    shape = x.shape
    if isinstance(x, Fp8Activation):
        aq, a_s = x.codes, x.scales
    else:
        x2d = x.reshape(-1, shape[-1])
        if not x2d.is_contiguous():
            x2d = x2d.contiguous()
        aq, a_s = quantize_activation_fp8(x2d)  # once per call: quantizing inside the GEMM redid it per tile
    m, n, k = aq.shape[0], layer.out_features, layer.in_features
    if m <= 64:  # decode
        y = fp8_gemm_triton(aq, a_s, layer.weight, layer.weight_scale, x.dtype, small_m_config(n, k, m))
    else:
        if m >= CONFIG.scaled_mm_min_m and scaled_mm_supports(m, n, k):
            y = fp8_gemm_scaled_mm(aq, a_s, layer.weight, layer.weight_scale, x.dtype)
        else:
            y = fp8_gemm_triton(aq, a_s, layer.weight, layer.weight_scale, x.dtype)
    if layer.bias is not None:
        y = y + layer.bias
    return y.reshape(*shape[:-1], n)


def fp8_hardware_available(device: torch.device | str | None = None) -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


BACKENDS["fp8"] = fp8_linear_forward

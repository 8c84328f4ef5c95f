"""The decode MLP's gate_up GEMM with silu * up and the FP8 quantization of the result in
the same launch (``fp8_gate_up_silu_kernel``): per layer, one launch fewer than the GEMM
followed by ``silu_mul`` (fused.py).

No grid barrier: the output tiles of one 128-column group of h (its gate and up tiles)
count themselves on a counter, and the program that finishes the group's last tile
computes that group of h from the BF16 gate/up values the other programs stored (still in
L2) and quantizes it. The bits are those of the two launches: the same GEMM tiles, the
same BF16 outputs, the same silu, multiply and 1x128 quantization ops.

Experimental: ``FUSE_SILU_EPILOGUE`` is off until a device run shows the two launches'
bits and a shorter decode step (tests/engine/test_gate_up_silu.py; the rollout bench with
the switch on). Written 2026-12-01 without device time: the interpreter and the sm_90
compile test have run it.
"""

from __future__ import annotations

import torch

from quantroll.kernels.fp8_linear import (Fp8Activation, decode_config, decode_grid, fp8_activation_buffers,
                                          quantize_activation_fp8, split_k_scratch)
from quantroll.kernels.fused import MAX_GROUP_COUNTERS, group_counters

# Off: measured on the H200 (2026-12-01), same bits, but no faster at 8B batch 16 and
# slower at batch 1 and 64 and on the MoE shape (docs/PERFORMANCE.md).
FUSE_SILU_EPILOGUE = False
MAX_ROWS = 64  # the decode GEMM's range


def applies(x, gate_up, down) -> bool:
    """The switch is on and this MLP call can take the fused path: at most 64 rows (the
    decode GEMM), block-FP8 gate_up and down on the fp8 backend, no biases, an
    intermediate size in whole 128-groups whose tiles do not straddle gate and up."""
    if not FUSE_SILU_EPILOGUE:
        return False
    rows = x.codes.shape[0] if isinstance(x, Fp8Activation) else x.reshape(-1, x.shape[-1]).shape[0]
    if rows > MAX_ROWS or gate_up.bias is not None or down.bias is not None:
        return False
    if not all(layer.format is not None and layer.format.name == "fp8" and layer.backend == "fp8"
               for layer in (gate_up, down)):
        return False
    block_n = decode_config(gate_up.out_features, gate_up.in_features, rows).block_n
    inter = gate_up.out_features // 2
    return inter % 128 == 0 and 128 % block_n == 0 and down.in_features == inter


def gate_up_silu(x, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype=torch.bfloat16,
                 cfg=None) -> Fp8Activation:
    """x (BF16 [..., H] or an Fp8Activation) through the block-FP8 gate_up weight [2I, H]
    -> h = silu(gate) * up as an Fp8Activation [..., I] (codes and 1x128 scales, what
    ``silu_mul(gate_up, quantize=True)`` returns). ``cfg``: the GEMM's tiles (default:
    the decode GEMM's)."""
    from quantroll.kernels.fp8_gemm_triton import fp8_gate_up_silu_kernel

    if isinstance(x, Fp8Activation):
        aq, a_s, shape = x.codes, x.scales, x.shape
    else:
        shape = x.shape
        aq, a_s = quantize_activation_fp8(x.reshape(-1, shape[-1]).contiguous())
    m, k = aq.shape
    n = weight.shape[0]
    inter = n // 2
    cfg = cfg or decode_config(n, k, m)
    if m > MAX_ROWS or inter % 128 or 128 % cfg.block_n:
        raise ValueError(f"gate_up_silu: M={m} (max {MAX_ROWS}), intermediate {inter} (a multiple of 128), "
                         f"tile rows {cfg.block_n} (a divisor of 128)")
    block_m, per_split, grid = decode_grid(m, n, k, cfg)
    if grid[1] * (inter // 128) > MAX_GROUP_COUNTERS:
        raise ValueError(f"gate_up_silu: {grid[1] * (inter // 128)} groups exceed the {MAX_GROUP_COUNTERS} counters")
    dev = aq.device
    gu = torch.empty(m, n, dtype=out_dtype, device=dev)
    partials, tile_counters = split_k_scratch(block_m, grid, cfg.block_n, dev, gu)
    hq, hs = fp8_activation_buffers(m, inter, dev)
    if m:
        fp8_gate_up_silu_kernel[grid](
            aq, a_s, weight, weight_scale, partials, gu, tile_counters, hq, hs, group_counters(dev), m, n, k, inter,
            aq.stride(0), aq.stride(1), a_s.stride(0), a_s.stride(1), weight.stride(0), weight.stride(1),
            weight_scale.stride(0), weight_scale.stride(1), gu.stride(0), gu.stride(1), hq.stride(0), hs.stride(0),
            hs.stride(1), BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=128, K_BLOCKS_PER_SPLIT=per_split, SPLIT=grid[2],
            DOT_F16=cfg.dot_f16, IMPRECISE_ACC=cfg.imprecise_acc, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return Fp8Activation(hq, hs, torch.Size([*shape[:-1], inter]), out_dtype)

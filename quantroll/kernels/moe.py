"""MoE experts on the GPU through the grouped Triton GEMM (see moe_triton.py).

``moe_align`` sorts (token, slot) pairs by expert with tensor ops only (no host
synchronization); ``grouped_experts_forward`` runs gate, up and down for all routed
pairs and sums each token's top-k outputs in a fixed order (deterministic).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantroll.kernels.choices import DEFAULT_ENGINE_KERNELS, EngineKernels

BLOCK_M = 16


MAX_ALIGN_KERNEL_PAIRS = 4096  # one program sorts them all (decode: batch 256 x top-8 = 2048)


def max_align_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks of block_m rows that ``pairs`` routed pairs can need at most (each expert's run padded)."""
    return (pairs + num_experts * (block_m - 1) + block_m - 1) // block_m


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted pair ids padded per expert [max_rows], expert of each block [max_rows / block_m], -1 past the end).

    Padding slots hold ``num_pairs`` (an invalid pair id). On the GPU, up to
    MAX_ALIGN_KERNEL_PAIRS pairs go through one Triton launch (``moe_align_fused``, the
    same result); more (prefill) through tensor ops."""
    if topk_ids.is_cuda and topk_ids.numel() <= MAX_ALIGN_KERNEL_PAIRS:
        return moe_align_fused(topk_ids, num_experts, block_m)
    return moe_align_torch(topk_ids, num_experts, block_m)


def moe_align_fused(topk_ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe_align`` in one launch (moe_align_kernel); at most MAX_ALIGN_KERNEL_PAIRS pairs."""
    from quantroll.kernels.launch import next_pow2
    from quantroll.kernels.moe_triton import moe_align_kernel

    flat = topk_ids.reshape(-1).contiguous()
    pairs = flat.numel()
    if pairs > MAX_ALIGN_KERNEL_PAIRS:
        raise ValueError(f"moe_align_fused: {pairs} routed pairs exceed its {MAX_ALIGN_KERNEL_PAIRS}")
    max_blocks = max_align_blocks(pairs, num_experts, block_m)
    sorted_ids = torch.empty(max_blocks * block_m, dtype=torch.int64, device=flat.device)
    block_expert = torch.empty(max_blocks, dtype=torch.int64, device=flat.device)
    moe_align_kernel[(1,)](flat, sorted_ids, block_expert, pairs, num_experts, max_blocks * block_m, max_blocks,
                           P_PAD=next_pow2(pairs, 16), E_PAD=next_pow2(num_experts + 1, 16), BLOCK_M=block_m,
                           ROWS=1024, BLOCKS=32, num_warps=4)
    return sorted_ids, block_expert


def moe_align_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe_align`` with tensor ops (any size; ~25 launches)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    max_blocks = max_align_blocks(pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    start_in_sorted = torch.cumsum(counts, 0) - counts
    rank = torch.arange(pairs, device=flat.device) - start_in_sorted[sorted_experts]
    dest = padded_start[sorted_experts] + rank
    sorted_ids = torch.full((max_blocks * block_m,), pairs, dtype=torch.int64, device=flat.device)
    sorted_ids.scatter_(0, dest, order)
    block_starts = torch.arange(max_blocks, device=flat.device) * block_m
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, torch.full_like(block_expert, -1))
    return sorted_ids, block_expert


def grouped_gemm(a, a_scale, w, w_scale, sorted_ids, block_expert, num_pairs, top_k, a_row_is_token,
                 out_dtype) -> torch.Tensor:
    """out[pair] = a[row(pair)] @ w[expert(pair)]^T for every routed pair; [num_pairs, N]."""
    from quantroll.kernels.moe_triton import grouped_gemm_kernel

    n, k = w.shape[1], w.shape[2]
    out = torch.empty(num_pairs, n, dtype=out_dtype, device=a.device)
    fp8 = w_scale is not None
    block_n = 64
    grid = (block_expert.numel(), (n + block_n - 1) // block_n)
    grouped_gemm_kernel[grid](
        a, a_scale if fp8 else a, w, w_scale if fp8 else w, out, sorted_ids, block_expert, num_pairs, top_k, n, k,
        a.stride(0), a_scale.stride(0) if fp8 else 0, a_scale.stride(1) if fp8 else 0,
        w.stride(0), w.stride(1), w.stride(2),
        w_scale.stride(0) if fp8 else 0, w_scale.stride(1) if fp8 else 0, w_scale.stride(2) if fp8 else 0,
        out.stride(0), A_ROW_IS_TOKEN=a_row_is_token, FP8=fp8, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=128,
        num_warps=4, num_stages=3,
    )
    return out


def grouped_experts_forward(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, stacks: dict,
                            quantized: tuple[torch.Tensor, torch.Tensor] | None = None,
                            kernels: EngineKernels = DEFAULT_ENGINE_KERNELS) -> torch.Tensor:
    """x [T, H]; stacks: gate_up (or gate and up) and down weights [E, out, in] (+ "*_scale"
    for FP8), see SparseMoE.stack_experts_ -> [T, H]. ``quantized``: x's FP8 codes and
    1x128 scales when its producer made them (FP8 stacks only; else quantized here).
    ``kernels``: the choices of the silu * up launch."""
    t, top_k = topk_ids.shape
    num_experts = stacks["down"].shape[0]
    pairs = t * top_k
    sorted_ids, block_expert = moe_align(topk_ids, num_experts)
    fp8 = "down_scale" in stacks
    if fp8:
        from quantroll.kernels.fp8_linear import quantize_activation_fp8

        xq, xs = quantized if quantized is not None else quantize_activation_fp8(x.contiguous())
    else:
        xq, xs = x.contiguous(), None
    if "gate_up" in stacks:  # one GEMM, then silu * up (quantized for the FP8 down GEMM) in one kernel
        from quantroll.kernels.fused import silu_mul

        gate_up = grouped_gemm(xq, xs, stacks["gate_up"], stacks.get("gate_up_scale"), sorted_ids, block_expert, pairs,
                               top_k, True, x.dtype)
        inter = silu_mul(gate_up, quantize=fp8, kernels=kernels)
        iq, i_s = (inter.codes, inter.scales) if fp8 else (inter, None)
    else:
        gate = grouped_gemm(xq, xs, stacks["gate"], stacks.get("gate_scale"), sorted_ids, block_expert, pairs, top_k,
                            True, x.dtype)
        up = grouped_gemm(xq, xs, stacks["up"], stacks.get("up_scale"), sorted_ids, block_expert, pairs, top_k, True,
                          x.dtype)
        inter = F.silu(gate) * up
        iq, i_s = quantize_activation_fp8(inter) if fp8 else (inter, None)
    down = grouped_gemm(iq, i_s, stacks["down"], stacks.get("down_scale"), sorted_ids, block_expert, pairs, top_k, False,
                        x.dtype)
    return combine_experts(down.view(t, top_k, -1), topk_weights.to(down.dtype).contiguous())


def fused_route(logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [N, E] -> (expert ids [N, top_k] int64, weights [N, top_k] in the
    logits' dtype) in one launch (moe_route_kernel), instead of softmax, topk, gather,
    sum, division and cast."""
    from quantroll.kernels.launch import next_pow2
    from quantroll.kernels.moe_triton import moe_route_kernel

    n, e = logits.shape
    idx = torch.empty(n, top_k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(n, top_k, dtype=logits.dtype, device=logits.device)
    if n:
        moe_route_kernel[(n,)](logits, idx, weights, e, logits.stride(0), idx.stride(0), weights.stride(0),
                               TOP_K=top_k, K_PAD=next_pow2(top_k, 2), E_PAD=next_pow2(e, 16), NORM=norm_topk_prob,
                               num_warps=1 if e <= 256 else 4)
    return idx, weights


def combine_experts(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """y [T, k, H] (each token's expert outputs), weights [T, k] -> [T, H]: what
    ``(y * weights[..., None]).sum(1)`` gives, in one launch (moe_combine_kernel)."""
    from quantroll.kernels.moe_triton import moe_combine_kernel

    t, k, h = y.shape
    out = torch.empty(t, h, dtype=y.dtype, device=y.device)
    block = 1024
    if t:
        moe_combine_kernel[(t, (h + block - 1) // block)](y, weights, out, h, y.stride(0), y.stride(1),
                                                         weights.stride(0), out.stride(0), TOP_K=k, BLOCK=block)
    return out

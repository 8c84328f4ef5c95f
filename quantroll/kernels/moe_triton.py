"""Grouped expert GEMM for MoE: every (token, slot) pair routed to an expert, in one launch.

Pairs are sorted by expert and each expert's run is padded to BLOCK_M rows
(``moe_align``), so a program owns BLOCK_M pairs of a single expert and reads that
expert's weight tile once for all of them. Weights are BF16 or block FP8 (1x128
activation and 128x128 weight scales, float32 accumulation per K block, as in
fp8_gemm_triton.py). No host synchronization: the grid is sized for the worst case and
programs past the last padded block return at once, so decode steps stay capturable
in a CUDA graph.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_gemm_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, c_ptr, sorted_ptr, block_expert_ptr,
                        num_pairs, top_k, N, K,
                        s_am, s_asm, s_ask, s_we, s_wn, s_wk, s_wse, s_wsn, s_wsk, s_cm,
                        A_ROW_IS_TOKEN: tl.constexpr, FP8: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_b)
    if expert < 0:
        return
    offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + offs_m)
    m_ok = pair < num_pairs
    a_row = pair // top_k if A_ROW_IS_TOKEN else pair
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * s_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * s_we + offs_n[None, :] * s_wn + offs_k[:, None] * s_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if FP8:
            a_s = tl.load(as_ptr + a_row * s_asm + kb * s_ask, mask=m_ok, other=0.0)
            w_s = tl.load(ws_ptr + expert * s_wse + (offs_n // 128) * s_wsn + kb * s_wsk, mask=n_ok, other=0.0)
            acc += tl.dot(a, w, max_num_imprecise_acc=32) * a_s[:, None] * w_s[None, :]
        else:
            acc += tl.dot(a, w)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * s_wk
    tl.store(c_ptr + pair[:, None] * s_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, P, E, MAX_ROWS, MAX_BLOCKS,
                     P_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
                     BLOCKS: tl.constexpr):
    """``moe_align`` (moe.py) in one program, for decode-sized pair counts: the tensor-op
    version is ~25 launches per MoE layer. P pairs with expert ids in [0, E); P_PAD >= P
    and E_PAD > E are powers of two (bin E collects the padding lanes).

    Pairs sorted by (expert, pair id) give each pair its stable rank within its expert;
    each expert's run starts at the padded cumulative count; every other slot of the
    sorted list holds P (no pair), and block b's expert is the number of experts whose
    padded run ends at or before b * BLOCK_M (-1 past the last run)."""
    offs = tl.arange(0, P_PAD)
    ok = offs < P
    expert = tl.where(ok, tl.load(ids_ptr + offs, mask=ok, other=0).to(tl.int32), E)
    counts = tl.histogram(expert, E_PAD)
    bins = tl.arange(0, E_PAD)
    counts = tl.where(bins < E, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    padded_start = padded_end - padded
    start_in_sorted = tl.cumsum(counts, 0) - counts
    keys = tl.sort(expert * P_PAD + offs)  # padding lanes (expert E) sort last
    s_expert = keys // P_PAD
    s_pair = keys % P_PAD
    s_ok = s_expert < E
    s_bin = tl.where(s_ok, s_expert, 0)
    rank = offs - tl.gather(start_in_sorted, s_bin, 0)
    dest = tl.gather(padded_start, s_bin, 0) + rank
    for r0 in range(0, MAX_ROWS, ROWS):
        r = r0 + tl.arange(0, ROWS)
        tl.store(sorted_ptr + r, tl.zeros([ROWS], tl.int64) + P, mask=r < MAX_ROWS)
    tl.debug_barrier()  # the padding fill lands before the pairs overwrite their slots
    tl.store(sorted_ptr + dest, s_pair.to(tl.int64), mask=s_ok)
    ends = tl.where(bins < E, padded_end, 2147483647)
    for b0 in range(0, MAX_BLOCKS, BLOCKS):
        blk = b0 + tl.arange(0, BLOCKS)
        n_done = tl.sum((ends[None, :] <= blk[:, None] * BLOCK_M).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + blk, tl.where(n_done < E, n_done, -1).to(tl.int64), mask=blk < MAX_BLOCKS)


@triton.jit
def moe_route_kernel(logits_ptr, idx_ptr, w_ptr, E, s_l, s_i, s_w,
                     TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, NORM: tl.constexpr):
    """One token per program: float32 softmax over the E router logits, the TOP_K largest
    probabilities in descending order (ties: the lower expert id first), their
    probabilities as weights (divided by their sum with NORM), as SparseMoE.route
    computes them with softmax, topk, gather and a division."""
    t = tl.program_id(0).to(tl.int64)  # token x stride: int64 like every row offset here
    offs = tl.arange(0, E_PAD)
    ok = offs < E
    x = tl.load(logits_ptr + t * s_l + offs, mask=ok, other=float("-inf")).to(tl.float32)
    e = tl.where(ok, tl.exp(x - tl.max(x, axis=0)), 0.0)
    p = e / tl.sum(e, axis=0)
    left = tl.where(ok, p, -1.0)  # probabilities are >= 0: -1 marks taken and padding lanes
    slots = tl.arange(0, K_PAD)
    chosen = tl.zeros([K_PAD], tl.int32)
    weight = tl.zeros([K_PAD], tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(left, axis=0)
        i = tl.min(tl.where(left == best, offs, E_PAD), axis=0)
        i = tl.where(i < E, i, 0)  # NaN logits match no lane: keep the id in range, the NaN weight shows
        chosen = tl.where(slots == j, i, chosen)
        weight = tl.where(slots == j, best, weight)
        left = tl.where(offs == i, -1.0, left)
    if NORM:
        weight = weight / tl.sum(weight, axis=0)
    k_ok = slots < TOP_K
    tl.store(idx_ptr + t * s_i + slots, chosen.to(tl.int64), mask=k_ok)
    tl.store(w_ptr + t * s_w + slots, weight.to(w_ptr.dtype.element_ty), mask=k_ok)


@triton.jit
def moe_combine_kernel(y_ptr, w_ptr, out_ptr, H, s_yt, s_yk, s_wt, s_ot, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = sum over slots k of bf16(y[t, k] * w[t, k]), the products rounded as
    PyTorch rounds them, summed in slot order in float32 and rounded once."""
    t = tl.program_id(0).to(tl.int64)  # token x stride passes 2^31 on long prefills (top_k x H per token)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < H
    acc = tl.zeros([BLOCK], tl.float32)
    for k in tl.static_range(TOP_K):
        w = tl.load(w_ptr + t * s_wt + k)
        y = tl.load(y_ptr + t * s_yt + k * s_yk + offs, mask=ok, other=0.0)
        acc += (y.to(tl.float32) * w.to(tl.float32)).to(y.dtype).to(tl.float32)
    tl.store(out_ptr + t * s_ot + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)

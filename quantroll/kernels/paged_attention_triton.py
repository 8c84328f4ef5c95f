"""Attention over the paged KV cache (engine/paged_cache.py), in Triton.

The pool of a layer is [num_blocks, BLOCK_SIZE, HKV, D], contiguous: the key of head h
at slot t sits at ``(t * HKV + h) * D``. An FP8 cache's values are [num_blocks, HKV, D,
BLOCK_SIZE] (positions minor: engine/paged_cache.py says why), so a value tile is loaded
as [D, BLOCK_S] and its transpose is the P.V dot's operand, reduced along contiguous bytes. A tile of BLOCK_S consecutive positions of one
sequence reads its blocks' ids from the sequence's row of the block table and gathers
the rows at their slots, so the key loop is the same as over a contiguous cache except
for that one indirection per tile.

- ``paged_decode_kernel``: one query token per sequence. One program per (sequence, KV
  head, split) serves the whole group of query heads sharing that KV head (GQA), so
  every key and value is read once per step. With SPLITS > 1 each program walks 1/SPLITS
  of the sequence's positions (whole tiles) and writes a partial result, which
  ``merge_splits_kernel`` combines (flash-decoding): that is what fills the GPU when
  batch x KV heads is small and contexts are long. Lengths come from device memory, so
  the kernels are CUDA-graph safe while sequences grow. The query group sits on the MMA's
  M side (a keys-on-M form, swap-AB, lost: docs/history.md).
  Its output can leave already quantized for a block-FP8 o_proj (QUANT_OUT: heads of 128
  are one 1x128 group each), which saves that linear its activation-quantize launch.
- ``paged_prefill_kernel``: any number of query tokens per sequence (new prompts, chunks
  of long prompts, recomputed sequences), flattened; queries attend causally to all of
  their sequence's positions up to their own, cached prefix included.
- the decode step's store of keys and values: kv_store_triton.py.

FP8 cache (FP8=True): codes E4M3 with one float32 scale per (slot, head). Codes widen
to float16 exactly and q is rounded to float16 for the dot; a key's scale multiplies its column of q.k after the dot, a value's scale,
divided by the tile's largest, its column of the probabilities before the PV dot (so P
stays in [0, 1], where float16 is finer than BF16), the largest the dot's result. No
dequantized tile is materialized. Softmax runs in float32 (online); with a BF16 cache P
is rounded to BF16 for the PV dot. Measured (bench/paged_attention.py, H200, 2026-12-03):
the BF16 cache reads at the copy rate from batch 64 up, the FP8 one at ~1.5x its bytes
(128-key tiles, 3 stages), ~1.3x faster than BF16 (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantroll.kernels.fused_triton import _quant_fp8_groups


@triton.jit
def _tile_slots(table_row, offs, ok, BLOCK_SIZE: tl.constexpr):
    blk = tl.load(table_row + offs // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
    return blk * BLOCK_SIZE + offs % BLOCK_SIZE


@triton.jit
def _load_tile(pool, slots, ok, kvh, offs_d, d_ok, HKV: tl.constexpr, D: tl.constexpr, COMPUTE: tl.constexpr):
    """[BLOCK_S, D_PAD] rows of one head at ``slots`` (zeros where not ok), in COMPUTE (E4M3
    codes widen exactly)."""
    rows = slots * HKV + kvh
    x = tl.load(pool + rows[:, None] * D + offs_d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
    return x.to(COMPUTE)


@triton.jit
def _load_values_positions_minor(pool, slots, ok, kvh, offs_d, d_ok, HKV: tl.constexpr, D: tl.constexpr,
                                 BLOCK_SIZE: tl.constexpr, COMPUTE: tl.constexpr):
    """[D_PAD, BLOCK_S] values of one head from a [num_blocks, HKV, D, BLOCK_SIZE] pool (as
    stored: the caller transposes where its dot wants [BLOCK_S, D_PAD]).

    Each block's BLOCK_SIZE positions are contiguous bytes (the hints say so: the compiler
    cannot see it through the block table) and are loaded whole, unmasked, so the loads
    vectorize (a per-position mask compiled to one-byte loads; zeroing the lanes past the
    sequence after the load cost a shared-memory round trip, 197 -> 274 us at 256 x 1024).
    Positions past the sequence may hold any code a freed block kept, but never a NaN: the
    stores write code 0 for a NaN element (_store_head, formats/kv_fp8.quantize_kv) and a GPU
    pool starts zeroed, so their zero probabilities cancel them. (In the sequence's last
    block the hint is not literally true past its length, where the table load gives block
    0: those lanes read that block's bytes, in bounds.)"""
    cols = ((slots // BLOCK_SIZE) * HKV + kvh) * (D * BLOCK_SIZE) + slots % BLOCK_SIZE
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_SIZE), BLOCK_SIZE)
    x = tl.load(pool + cols[None, :] + offs_d[:, None] * BLOCK_SIZE, mask=d_ok[:, None], other=0.0)
    return x.to(COMPUTE)


@triton.jit
def _scale_index(slots, kvh, HKV: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Where the scale of ``slots``' position of head ``kvh`` sits in a [num_blocks, HKV,
    BLOCK_SIZE] scale pool (a head's scales of one block contiguous)."""
    return ((slots // BLOCK_SIZE) * HKV + kvh) * BLOCK_SIZE + slots % BLOCK_SIZE


@triton.jit
def _load_scales(scales, slots, ok, kvh, HKV: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    idx = _scale_index(slots, kvh, HKV, BLOCK_SIZE)
    idx = tl.max_contiguous(tl.multiple_of(idx, BLOCK_SIZE), BLOCK_SIZE)
    return tl.load(scales + idx, mask=ok, other=0.0)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _tile_scores(q, k_ptr, ks_ptr, table_row, offs, ok, kvh, offs_d, d_ok, BLOCK_SIZE: tl.constexpr,
                 HKV: tl.constexpr, D: tl.constexpr, COMPUTE: tl.constexpr, FP8: tl.constexpr, IEEE: tl.constexpr):
    """(the tile's slots, q.k over its keys) before masking and scaling: the step the decode
    and prefill kernels share (an FP8 cache's key scales multiply their columns)."""
    slots = _tile_slots(table_row, offs, ok, BLOCK_SIZE)
    k = _load_tile(k_ptr, slots, ok, kvh, offs_d, d_ok, HKV, D, COMPUTE)
    qk = _dot(q, tl.trans(k), IEEE)
    if FP8:
        qk = qk * _load_scales(ks_ptr, slots, ok, kvh, HKV, BLOCK_SIZE)[None, :]
    return slots, qk


@triton.jit
def _accumulate_pv(acc, alpha, p, v_ptr, vs_ptr, slots, ok, kvh, offs_d, d_ok, HKV: tl.constexpr, D: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, COMPUTE: tl.constexpr, FP8: tl.constexpr, IEEE: tl.constexpr):
    """One key tile's P.V added to the online-softmax accumulator (rescaled by ``alpha``):
    the step the decode and prefill kernels share. An FP8 cache's value scales, relative
    to the tile's largest, join P (in [0, 1], float16) and the largest scales the dot."""
    if FP8:
        v = tl.trans(_load_values_positions_minor(v_ptr, slots, ok, kvh, offs_d, d_ok, HKV, D, BLOCK_SIZE, COMPUTE))
    else:
        v = _load_tile(v_ptr, slots, ok, kvh, offs_d, d_ok, HKV, D, COMPUTE)
    if FP8:
        v_scale = _load_scales(vs_ptr, slots, ok, kvh, HKV, BLOCK_SIZE)
        top = tl.max(v_scale, axis=0)
        p = p * (v_scale / tl.where(top > 0, top, 1.0))[None, :]
    pv = _dot(p.to(COMPUTE), v, IEEE)
    if FP8:
        pv = pv * top
    return acc * alpha[:, None] + pv


@triton.jit
def _online_softmax_tile(acc, m_i, l_i, qk, v_ptr, vs_ptr, slots, ok, kvh, offs_d, d_ok, HKV: tl.constexpr,
                         D: tl.constexpr, BLOCK_SIZE: tl.constexpr, COMPUTE: tl.constexpr, FP8: tl.constexpr,
                         IEEE: tl.constexpr, EMPTY_ROWS: tl.constexpr):
    """One key tile of the online softmax: (acc, running max, running sum) after the tile's
    masked scores qk (-inf where a key is not seen). EMPTY_ROWS: a row may have seen no key
    yet (a prefill's padded queries), whose max stays -inf and must not make exp() NaN."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    if EMPTY_ROWS:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.exp(qk - m_use[:, None])
    alpha = tl.exp(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = _accumulate_pv(acc, alpha, p, v_ptr, vs_ptr, slots, ok, kvh, offs_d, d_ok, HKV, D, BLOCK_SIZE, COMPUTE, FP8,
                         IEEE)
    return acc, m_new, l_i


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, table_ptr, len_ptr, o_ptr, po_ptr, pml_ptr, c_ptr, cs_ptr,
                        sm_scale, s_qb, s_qh, s_tb, s_ob, s_oh, s_cb, s_csg,
                        HKV: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, GROUP: tl.constexpr,
                        G_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_S: tl.constexpr, SPLITS: tl.constexpr,
                        FP8: tl.constexpr, IEEE: tl.constexpr, QUANT_OUT: tl.constexpr):
    """Program (sequence, KV head, split). QUANT_OUT (D = 128, one split): the output is
    handed to a block-FP8 o_proj already quantized, each head one 1x128 group: E4M3 codes
    at ``c_ptr`` [B, H * D] and scales at ``cs_ptr`` (sequence b, head h at b + h * s_csg),
    bit for bit what act_quant_fp8_kernel makes of the BF16 output, which is not stored."""
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(len_ptr + b).to(tl.int32)
    per_split = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_S) * BLOCK_S
    start = split * per_split
    end = tl.minimum(start + per_split, length)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    g_ok = offs_g < GROUP
    d_ok = offs_d < D
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + offs_d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0)
    COMPUTE = tl.float16 if FP8 else q.dtype  # E4M3 widens to float16 in one instruction, to BF16 in several
    q = q.to(COMPUTE)
    table_row = table_ptr + b * s_tb
    m_i = tl.full((G_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((G_PAD,), dtype=tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), dtype=tl.float32)
    for s0 in range(start, end, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        ok = offs < end
        slots, qk = _tile_scores(q, k_ptr, ks_ptr, table_row, offs, ok, kvh, offs_d, d_ok, BLOCK_SIZE, HKV, D,
                                 COMPUTE, FP8, IEEE)
        qk = tl.where(ok[None, :], qk * sm_scale, float("-inf"))
        acc, m_i, l_i = _online_softmax_tile(acc, m_i, l_i, qk, v_ptr, vs_ptr, slots, ok, kvh, offs_d, d_ok, HKV,
                                             D, BLOCK_SIZE, COMPUTE, FP8, IEEE, False)
    out_ok = g_ok[:, None] & d_ok[None, :]
    if SPLITS == 1:
        out = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
        if QUANT_OUT:
            codes, scales = _quant_fp8_groups(tl.where(out_ok, out.to(tl.float32), 0.0), G_PAD)
            tl.store(c_ptr + b * s_cb + heads[:, None] * D + offs_d[None, :], codes, mask=out_ok)
            tl.store(cs_ptr + b + heads * s_csg, scales, mask=g_ok)
        else:
            tl.store(o_ptr + b * s_ob + heads[:, None] * s_oh + offs_d[None, :], out, mask=out_ok)
    else:
        # partials [B, H, SPLITS, D] (acc / l) and [B, H, SPLITS, 2] (m, l); an empty split stores l = 0
        row = (b * (HKV * GROUP) + heads) * SPLITS + split
        safe_l = tl.where(l_i > 0, l_i, 1.0)
        tl.store(po_ptr + row[:, None] * D + offs_d[None, :], acc / safe_l[:, None], mask=out_ok)
        tl.store(pml_ptr + row * 2, m_i, mask=g_ok)
        tl.store(pml_ptr + row * 2 + 1, l_i, mask=g_ok)


@triton.jit
def merge_splits_kernel(po_ptr, pml_ptr, o_ptr, c_ptr, cs_ptr, s_ob, s_oh, s_cb, s_csg, H: tl.constexpr,
                        D: tl.constexpr, D_PAD: tl.constexpr, SPLITS: tl.constexpr, S_PAD: tl.constexpr,
                        QUANT_OUT: tl.constexpr):
    """Program (sequence, query head): the log-sum-exp weighted mean of the splits; with
    QUANT_OUT stored as the decode kernel's quantized output (D = 128: one group)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_ok = offs_s < SPLITS
    row = (b * H + h) * SPLITS + offs_s
    m = tl.load(pml_ptr + row * 2, mask=s_ok, other=float("-inf"))
    l = tl.load(pml_ptr + row * 2 + 1, mask=s_ok, other=0.0)
    m = tl.where(l > 0, m, float("-inf"))
    m_all = tl.max(m, axis=0)
    w = tl.where(l > 0, l * tl.exp(m - m_all), 0.0)
    o = tl.load(po_ptr + row[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    out = (tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)).to(o_ptr.dtype.element_ty)
    if QUANT_OUT:
        codes, scales = _quant_fp8_groups(tl.where(offs_d < D, out.to(tl.float32), 0.0), 1)
        tl.store(c_ptr + b * s_cb + h * D + offs_d[None, :], codes, mask=(offs_d < D)[None, :])
        tl.store(cs_ptr + b + h * s_csg + tl.arange(0, 1), scales)
    else:
        tl.store(o_ptr + b * s_ob + h * s_oh + offs_d, out, mask=offs_d < D)


@triton.jit
def paged_prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, table_ptr, start_ptr, ctx_ptr, o_ptr, sm_scale,
                         s_qt, s_qh, s_tb, s_ot, s_oh,
                         HKV: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, GROUP: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr,
                         IEEE: tl.constexpr):
    """Program (sequence, tile of BLOCK_M of its queries, query head)."""
    s = tl.program_id(0).to(tl.int64)
    mt = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // GROUP
    q0 = tl.load(start_ptr + s)
    q_len = tl.load(start_ptr + s + 1) - q0
    ctx = tl.load(ctx_ptr + s)
    pos0 = ctx - q_len  # absolute position of the sequence's first query
    rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    qpos = pos0 + rows
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    tok = (q0 + rows).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * s_qt + h * s_qh + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                other=0.0)
    COMPUTE = tl.float16 if FP8 else q.dtype
    q = q.to(COMPUTE)
    hi = tl.minimum(ctx, pos0 + (mt + 1) * BLOCK_M)  # the tile's last query sees positions < hi
    hi = tl.where(mt * BLOCK_M < q_len, hi, 0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), dtype=tl.float32)
    table_row = table_ptr + s * s_tb
    for n0 in range(0, hi, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        ok = offs < hi
        slots, qk = _tile_scores(q, k_ptr, ks_ptr, table_row, offs, ok, kvh, offs_d, d_ok, BLOCK_SIZE, HKV, D, COMPUTE,
                                 FP8, IEEE)
        visible = ok[None, :] & (offs[None, :] <= qpos[:, None])
        qk = tl.where(visible, qk * sm_scale, float("-inf"))
        acc, m_i, l_i = _online_softmax_tile(acc, m_i, l_i, qk, v_ptr, vs_ptr, slots, ok, kvh, offs_d, d_ok, HKV, D,
                                             BLOCK_SIZE, COMPUTE, FP8, IEEE, True)
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    tl.store(o_ptr + tok[:, None] * s_ot + h * s_oh + offs_d[None, :], (acc / safe_l[:, None]).to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])

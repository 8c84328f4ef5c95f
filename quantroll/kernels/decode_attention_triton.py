"""Decode attention over a static KV cache, reading only each sequence's valid keys.

One program per (sequence, KV head) handles the whole group of query heads that share
that KV head (GQA), so every key and value is read once per step. Online softmax in
float32 (flash-decoding without the split), P cast to the value dtype for the PV dot.
The loop bound is read from device memory, so the kernel is CUDA-graph safe while
sequences grow.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, sm_scale,
                            s_qb, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_ob, s_oh,
                            HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
                            BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    length = tl.load(len_ptr + b).to(tl.int32)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    g_ok = offs_g < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + offs_d[None, :], mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full((G_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((G_PAD,), dtype=tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), dtype=tl.float32)
    k_base = k_ptr + b * s_kb + kvh * s_kh
    v_base = v_ptr + b * s_vb + kvh * s_vh
    for start in range(0, length, BLOCK_S):
        offs_s = start + tl.arange(0, BLOCK_S)
        s_ok = offs_s < length
        k = tl.load(k_base + offs_s[:, None] * s_ks + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        qk = tl.where(s_ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + offs_s[:, None] * s_vs + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * s_ob + heads[:, None] * s_oh + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=g_ok[:, None] & d_ok[None, :])

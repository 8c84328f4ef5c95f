"""NVFP4 weight quantization: pass 1 (absmax over the whole tensor for the global scale),
pass 2 (16-groups: E4M3 group scales, packed E2M1 codes), the generic kernel and the bf16
fast path, and the E2M1 encoding check."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantroll.kernels.launch import interpreting
from quantroll.kernels.quantize_triton_common import (
    CONFIGS, EXACT, _abs_bits, _cdiv, _clamp448, _div_rn_pos, _div_rn_recip, _div_setup, _div_setup_normal,
    _recip_scaled, _row_tiles, _sm_count)


@triton.jit
def _e2m1_check_kernel(q_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Test hook: _e2m1_mag of float32 values >= 0."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, _e2m1_mag(tl.load(q_ptr + offs, mask=m, other=0.0)).to(tl.uint8), mask=m)


def e2m1_check(q: torch.Tensor) -> torch.Tensor:
    """The bf16 NVFP4 kernel's E2M1 magnitude codes (uint8) of a float32 CUDA tensor q >= 0."""
    out = torch.empty(q.shape, dtype=torch.uint8, device=q.device)
    _e2m1_check_kernel[(_cdiv(q.numel(), 4096),)](q, out, q.numel(), BLOCK=4096, **EXACT)
    return out


@triton.jit(do_not_specialize=["amax_idx"])
def _absmax_kernel(x_ptr, amax_ptr, amax_idx, numel, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """NVFP4 pass 1: max of |x| bits over ITERS consecutive blocks, one relaxed atomic max."""
    base = tl.program_id(0).to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for it in range(ITERS):
        offs = base + it * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, _abs_bits(x))
    tl.atomic_max(amax_ptr + amax_idx, tl.max(acc), sem="relaxed")


@triton.jit
def _e2m1_code(q, xbits):
    """E2M1 code of q = |x| / divisor (>= 0) with the sign of x: nearest even, saturating at 6.

    Below 1, 2q + 2**23 rounds 2q to an integer (codes 0..2); from 1 on, the mantissa is
    rounded to one bit, which gives (exponent + 1) * 2 + bit = the code, capped at 7."""
    below_one = tl.fma(q, 2.0, 8388608.0).to(tl.int32, bitcast=True) & 3  # 2q is exact: one rounding
    qb = q.to(tl.int32, bitcast=True)
    from_one = tl.minimum((qb + (0x1FFFFF - (252 << 22)) + ((qb >> 22) & 1)) >> 22, 7)
    mag = tl.where(q < 1.0, below_one, from_one)
    return mag | ((xbits >> 28) & 8)


@triton.jit
def _pack_nibbles(code, BM: tl.constexpr, G: tl.constexpr):
    """[BM, G, 8] codes -> [BM, G, 4] bytes, element 2i in the low nibble."""
    lo, hi = tl.split(tl.reshape(code, (BM, G, 4, 2)))
    return (lo | (hi << 4)).to(tl.uint8)


@triton.jit(do_not_specialize=["amax_idx", "N"])
def _nvfp4_kernel(x_ptr, q_ptr, s_ptr, gs_ptr, amax_ptr, amax_idx, N, K, n_groups, n_bytes,
                  BM: tl.constexpr, G: tl.constexpr, INTERPRET: tl.constexpr):
    """NVFP4 pass 2: a [BM rows] x [G groups of 16] tile per program.

    Each group is loaded as two halves of 8 with the same layout, so one thread holds a
    whole group: its amax, scale and reciprocal are computed once, in registers."""
    pk = tl.program_id(0)  # group tile (consecutive programs walk along the rows' memory)
    pm = tl.program_id(1)  # row tile
    # global = amax / (448 * 6), or 1 for an all-zero tensor; the first program stores it
    amax_bits = tl.load(amax_ptr + amax_idx)
    gscale = tl.math.div_rn(amax_bits.to(tl.float32, bitcast=True), 2688.0)
    gscale = tl.maximum(gscale, 1.1754943508222875e-38)  # never below FP32_TINY (nvfp4_global_scale)
    gscale = tl.where(amax_bits > 0, gscale, 1.0)
    tl.store(gs_ptr, gscale, mask=(pm == 0) & (pk == 0))

    rows = pm * BM + tl.arange(0, BM)
    gidx = pk * G + tl.arange(0, G)
    c0 = gidx[:, None] * 16 + tl.arange(0, 8)[None, :]  # [G, 8]: first half of each group
    c1 = c0 + 8
    rmask = rows < N
    base = rows.to(tl.int64)[:, None, None] * K
    x0 = tl.load(x_ptr + base + c0[None, :, :], mask=rmask[:, None, None] & (c0 < K)[None, :, :],
                 other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + base + c1[None, :, :], mask=rmask[:, None, None] & (c1 < K)[None, :, :],
                 other=0.0).to(tl.float32)
    xb0 = x0.to(tl.int32, bitcast=True)
    xb1 = x1.to(tl.int32, bitcast=True)
    ab0 = xb0 & 0x7FFFFFFF
    ab1 = xb1 & 0x7FFFFFFF
    gbits = tl.maximum(tl.max(ab0, axis=2), tl.max(ab1, axis=2))  # [BM, G]
    gmax = gbits.to(tl.float32, bitcast=True)
    g2 = tl.broadcast_to(gscale, (BM, G))
    # s = e4m3(amax / 6 / global), never 0 for a nonzero group (2**-9 instead)
    t = tl.math.div_rn(tl.math.div_rn(gmax, tl.full((BM, G), 6.0, tl.float32)), g2)
    sf = _clamp448(t).to(tl.float8e4nv).to(tl.float32)
    sf = tl.where((sf == 0.0) & (gbits > 0), 0.001953125, sf)
    step = sf * g2
    divisor = tl.where(step > 0.0, step, 1.0)
    a0 = ab0.to(tl.float32, bitcast=True)
    a1 = ab1.to(tl.float32, bitcast=True)
    if gscale >= 8.271806125530277e-25:  # 2**-80: every divisor >= 2**-89, the usual case
        Y = _recip_scaled(divisor, INTERPRET)[:, :, None]
        d3 = divisor[:, :, None]
        q0 = _div_rn_recip(a0, d3, Y, INTERPRET)
        q1 = _div_rn_recip(a1, d3, Y, INTERPRET)
    else:  # a tensor of tiny values: scale each dividend into the fast path's range
        p, s, dn, y = _div_setup(divisor, INTERPRET)
        p, s, dn, y = p[:, :, None], s[:, :, None], dn[:, :, None], y[:, :, None]
        q0 = _div_rn_pos(a0, p, s, dn, y, INTERPRET)
        q1 = _div_rn_pos(a1, p, s, dn, y, INTERPRET)
    b0 = _pack_nibbles(_e2m1_code(q0, xb0), BM, G)
    b1 = _pack_nibbles(_e2m1_code(q1, xb1), BM, G)
    bc0 = gidx[:, None] * 8 + tl.arange(0, 4)[None, :]  # [G, 4] byte columns of the first half
    bc1 = bc0 + 4
    bbase = rows.to(tl.int64)[:, None, None] * n_bytes
    tl.store(q_ptr + bbase + bc0[None, :, :], b0, mask=rmask[:, None, None] & (bc0 < n_bytes)[None, :, :])
    tl.store(q_ptr + bbase + bc1[None, :, :], b1, mask=rmask[:, None, None] & (bc1 < n_bytes)[None, :, :])
    soffs = rows.to(tl.int64)[:, None] * n_groups + gidx[None, :]
    tl.store(s_ptr + soffs, sf.to(tl.float8e4nv), mask=rmask[:, None] & (gidx < n_groups)[None, :])


@triton.jit
def _e2m1_mag(q):
    """E2M1 magnitude code (0..7) of q >= 0: nearest even, saturating at 6 (elements.e2m1_encode).

    Below 1, 2q + 2**23 rounds 2q to an integer: the code, in the two low bits (2q is exact,
    so one rounding). From 1 on, rounding the float32 bits at bit 22 (nearest even: the
    bit itself breaks ties) leaves (exponent - 125) * 2 + mantissa bit = the code; below 1
    that integer is at most the first one and negative under 0.5, and from 1 on the first
    one's low bits are at most it, so the larger of the two is the code either way."""
    low = tl.fma(q, 2.0, 8388608.0).to(tl.int32, bitcast=True) & 3
    qb = q.to(tl.int32, bitcast=True)
    high = (qb + (0x1FFFFF - (252 << 22)) + ((qb >> 22) & 1)) >> 22
    return tl.maximum(low, tl.minimum(high, 7))


@triton.jit
def _prmt_7351(a, b):
    return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7351;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _prmt_dc98(a, b):
    return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0xDC98;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _prmt_7632(a, b):
    return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _with_signs(mags, w0, w1, w2, w3, INTERPRET: tl.constexpr):
    """8 packed magnitude codes (element 2p in the low nibble of byte p) with the sign bits of
    their 8 bf16, taken from 4 words (element 2p in the low half of word p): bit 4j + 3 for
    element j. Four byte permutes (prmt; one replicates each byte's sign bit) and two masked
    ors instead of two shifts and a mask per element."""
    if INTERPRET:
        s = ((w0 >> 12) & 8) | ((w0 >> 24) & 0x80)
        s |= (((w1 >> 12) & 8) | ((w1 >> 24) & 0x80)) << 8
        s |= (((w2 >> 12) & 8) | ((w2 >> 24) & 0x80)) << 16
        s |= (((w3 >> 12) & 8) | ((w3 >> 24) & 0x80)) << 24
        return mags | s
    else:
        a = _prmt_7351(w0, w1)  # bytes: w0.b1, w1.b1, w0.b3, w1.b3
        b = _prmt_7351(w2, w3)  # bytes: w2.b1, w3.b1, w2.b3, w3.b3
        lo = _prmt_dc98(a, b)  # byte p = 0xFF if element 2p is negative, else 0
        hi = _prmt_7632(a, b)  # byte p = word p's high byte: bit 7 is element 2p+1's sign
        return ((lo & 0x08080808) | mags) | (hi & -0x7F7F7F80)  # -0x7F7F7F80 == 0x80808080 as int32


@triton.jit
def _pack_codes(c_lo, c_hi, BM: tl.constexpr, G: tl.constexpr):
    """[BM, G, 4] codes of elements 2p (c_lo) and 2p+1 (c_hi) -> [BM, G] int32, element 2p
    in the low nibble of byte p (little-endian: the bytes of pack_nibbles)."""
    pair = c_lo + (c_hi << 4)
    e, o = tl.split(tl.reshape(pair, (BM, G, 2, 2)))  # pairs (0, 2) and (1, 3)
    h = e + (o << 8)
    h0, h1 = tl.split(h)
    return h0 + (h1 << 16)


@triton.jit
def _split4(w, BM: tl.constexpr, G: tl.constexpr):
    """[BM, G, 4] -> its four [BM, G] slices along the last axis."""
    e, o = tl.split(tl.reshape(w, (BM, G, 2, 2)))
    w0, w2 = tl.split(e)
    w1, w3 = tl.split(o)
    return w0, w1, w2, w3


@triton.jit
def _max_u16x2(a, b, INTERPRET: tl.constexpr):
    """Max of each 16-bit half (max.u16x2) of non-negative int32 words."""
    if INTERPRET:
        return tl.maximum(a & -65536, b & -65536) | tl.maximum(a & 0xFFFF, b & 0xFFFF)
    else:
        return tl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                         is_pure=True, pack=1)


@triton.jit
def _nvfp4_half(w, m, Y, d3, p, s, dn, y, FAST: tl.constexpr, BM: tl.constexpr, G: tl.constexpr,
                INTERPRET: tl.constexpr):
    """Half groups: [BM, G, 4] words of 8 bf16 (m: without their sign bits) -> [BM, G] int32
    of their 8 packed codes."""
    a_lo = (m << 16).to(tl.float32, bitcast=True)  # |x| of element 2p, exact in float32
    a_hi = (m & -65536).to(tl.float32, bitcast=True)  # |x| of element 2p + 1
    if FAST:
        q_lo = _div_rn_recip(a_lo, d3, Y, INTERPRET)
        q_hi = _div_rn_recip(a_hi, d3, Y, INTERPRET)
    else:
        q_lo = _div_rn_pos(a_lo, p, s, dn, y, INTERPRET)
        q_hi = _div_rn_pos(a_hi, p, s, dn, y, INTERPRET)
    mags = _pack_codes(_e2m1_mag(q_lo), _e2m1_mag(q_hi), BM, G)
    w0, w1, w2, w3 = _split4(w, BM, G)
    return _with_signs(mags, w0, w1, w2, w3, INTERPRET)


@triton.jit
def _nvfp4_tile(w0, w1, rows, gidx, gmask, oc, q_ptr, s_ptr, N, n_groups, gscale, gs_s, gs_dn, gs_y,
                BM: tl.constexpr, G: tl.constexpr, INTERPRET: tl.constexpr):
    """Quantize one tile from its loaded words (w0, w1: the two halves of each group)."""
    # group amax: max of the 16-bit magnitudes of each word's two bf16 (integer order is
    # float order for them, as for the float32 bits), then of the two halves: exact
    m0 = w0 & 0x7FFF7FFF
    m1 = w1 & 0x7FFF7FFF
    v0, v1, v2, v3 = _split4(_max_u16x2(m0, m1, INTERPRET), BM, G)
    mx = _max_u16x2(_max_u16x2(v0, v1, INTERPRET), _max_u16x2(v2, v3, INTERPRET), INTERPRET)
    gmax = tl.maximum(mx & -65536, mx << 16).to(tl.float32, bitcast=True)  # [BM, G]
    # s = e4m3(amax / 6 / global), never 0 for a nonzero group (2**-9 instead): e4m3 of
    # max(t, 2**-9) is exactly that (rounding is monotone), and the cast saturates at 448
    u = tl.math.div_rn(gmax, tl.full((BM, G), 6.0, tl.float32))
    t = _div_rn_pos(u, 1.0, gs_s, gs_dn, gs_y, INTERPRET)  # exact for t >= 2**-100
    s8 = tl.maximum(t, 0.001953125).to(tl.float8e4nv)
    step = s8.to(tl.float32) * gscale  # > 0: an all-zero group divides zeros by it
    d3 = step[:, :, None]
    if gscale >= 8.271806125530277e-25:  # 2**-80: every step >= 2**-89, _div_rn_recip's range
        Y = _recip_scaled(step, INTERPRET)[:, :, None]
        o0 = _nvfp4_half(w0, m0, Y, d3, 1.0, 1.0, 1.0, 1.0, True, BM, G, INTERPRET)
        o1 = _nvfp4_half(w1, m1, Y, d3, 1.0, 1.0, 1.0, 1.0, True, BM, G, INTERPRET)
    else:  # a tensor of tiny values: scale each dividend into the fast path's range
        p, s, dn, y = _div_setup(step, INTERPRET)
        p, s, dn, y = p[:, :, None], s[:, :, None], dn[:, :, None], y[:, :, None]
        o0 = _nvfp4_half(w0, m0, 1.0, d3, p, s, dn, y, False, BM, G, INTERPRET)
        o1 = _nvfp4_half(w1, m1, 1.0, d3, p, s, dn, y, False, BM, G, INTERPRET)
    rmask = rows < N
    ro = rows.to(tl.int64)
    tl.store(q_ptr + ro[:, None, None] * (n_groups * 2) + oc[None, :, :], tl.join(o0, o1),
             mask=rmask[:, None, None] & gmask[None, :, None])
    s_out = tl.where(mx > 0, s8.to(tl.uint8, bitcast=True), 0).to(tl.uint8)
    tl.store(s_ptr + ro[:, None] * n_groups + gidx[None, :], s_out, mask=rmask[:, None] & gmask[None, :])


@triton.jit(do_not_specialize=["amax_idx", "N"])
def _nvfp4_bf16_kernel(x_ptr, q_ptr, s_ptr, gs_ptr, amax_ptr, amax_idx, N, n_groups,
                       BM: tl.constexpr, G: tl.constexpr, ITERS: tl.constexpr, PREFETCH: tl.constexpr,
                       INTERPRET: tl.constexpr):
    """NVFP4 pass 2 for bf16 weights whose rows are whole groups (K % 16 == 0).

    x_ptr: the weight as int32 words (two bf16 each); q_ptr: the codes as int32 words (8
    codes each); s_ptr: the scales as uint8. Each program quantizes ITERS tiles of
    [BM rows] x [G groups], one below the other; a thread holds whole groups (two halves
    of 4 words with the same layout), so a group's amax, scale and reciprocal stay in its
    registers. With PREFETCH, the next tile's loads are issued before this tile's
    arithmetic. Per element: one shift or mask (bf16 -> float32), 3 operations of
    division, 8 of E2M1 code, under 2 of sign and packing."""
    pk = tl.program_id(0)  # group tile (consecutive programs walk along the rows' memory)
    pm = tl.program_id(1)  # run of ITERS row tiles
    amax_bits = tl.load(amax_ptr + amax_idx)
    gscale = tl.math.div_rn(amax_bits.to(tl.float32, bitcast=True), 2688.0)
    gscale = tl.maximum(gscale, 1.1754943508222875e-38)  # never below FP32_TINY (nvfp4_global_scale)
    gscale = tl.where(amax_bits > 0, gscale, 1.0)
    tl.store(gs_ptr, gscale, mask=(pm == 0) & (pk == 0))
    gs_s, gs_dn, gs_y = _div_setup_normal(gscale, INTERPRET)  # the division by gscale, hoisted

    wpr = n_groups * 8  # words per row: a multiple of 8, so the 16-byte loads stay aligned
    gidx = pk * G + tl.arange(0, G)
    gmask = gidx < n_groups
    c0 = gidx[:, None] * 8 + tl.arange(0, 4)[None, :]  # [G, 4] words of the first half of each group
    oc = gidx[:, None] * 2 + tl.arange(0, 2)[None, :]  # [G, 2] output words of each group
    rows = pm * (BM * ITERS) + tl.arange(0, BM)
    if PREFETCH:
        m3 = (rows < N)[:, None, None] & gmask[None, :, None]
        base = rows.to(tl.int64)[:, None, None] * wpr + c0[None, :, :]
        nx0 = tl.load(x_ptr + base, mask=m3, other=0)
        nx1 = tl.load(x_ptr + base + 4, mask=m3, other=0)
        for it in range(ITERS):
            w0 = nx0
            w1 = nx1
            nrows = rows + BM  # the next tile's loads before this tile's arithmetic
            nm3 = ((nrows < N) & (it + 1 < ITERS))[:, None, None] & gmask[None, :, None]
            nbase = nrows.to(tl.int64)[:, None, None] * wpr + c0[None, :, :]
            nx0 = tl.load(x_ptr + nbase, mask=nm3, other=0)
            nx1 = tl.load(x_ptr + nbase + 4, mask=nm3, other=0)
            _nvfp4_tile(w0, w1, rows, gidx, gmask, oc, q_ptr, s_ptr, N, n_groups, gscale, gs_s, gs_dn, gs_y,
                        BM, G, INTERPRET)
            rows = nrows
    else:
        for it in range(ITERS):
            m3 = (rows < N)[:, None, None] & gmask[None, :, None]
            base = rows.to(tl.int64)[:, None, None] * wpr + c0[None, :, :]
            w0 = tl.load(x_ptr + base, mask=m3, other=0)
            w1 = tl.load(x_ptr + base + 4, mask=m3, other=0)
            _nvfp4_tile(w0, w1, rows, gidx, gmask, oc, q_ptr, s_ptr, N, n_groups, gscale, gs_s, gs_dn, gs_y,
                        BM, G, INTERPRET)
            rows += BM


def launch_absmax(x: torch.Tensor, amax_bits: torch.Tensor, idx: int, **cfg) -> None:
    """Atomic max of |x|'s float32 bits into amax_bits[idx] (int32, zeroed by the caller).

    About ctas_per_sm programs per multiprocessor, each over a power-of-two number of
    consecutive blocks (few atomics, few compiled variants)."""
    cfg = {**CONFIGS["absmax"], **cfg}
    numel = x.numel()
    block = cfg["BLOCK"]
    n_blocks = _cdiv(numel, block)
    iters = 1
    while iters < 64 and iters * _sm_count(x) * cfg["ctas_per_sm"] < n_blocks:
        iters *= 2
    grid = (_cdiv(n_blocks, iters),)
    _absmax_kernel[grid](x, amax_bits, idx, numel, BLOCK=block, ITERS=iters, num_warps=cfg["num_warps"], **EXACT)


def nvfp4_bf16_path(x: torch.Tensor, data: torch.Tensor) -> bool:
    """Whether pass 2 takes the bf16 kernel: bf16 rows of whole groups (K % 16 == 0), input and
    codes 16-byte aligned (they are read and written as int32 words). Others (float16,
    float32, a partial last group) take the generic kernel."""
    return (x.dtype == torch.bfloat16 and x.shape[1] % 16 == 0 and x.data_ptr() % 16 == 0
            and data.data_ptr() % 16 == 0)


def launch_nvfp4(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor,
                 amax_bits: torch.Tensor, idx: int, **cfg) -> None:
    """Pass 2 (after launch_absmax): data [N, ceil(K/2)] packed uint8, scale [N, ceil(K/16)] e4m3.

    ``cfg`` overrides the tile settings of whichever kernel runs; ``generic=True`` forces
    the generic kernel (benchmarks)."""
    n, k = x.shape
    n_groups = _cdiv(k, 16)
    if not cfg.get("generic", False) and nvfp4_bf16_path(x, data):
        cfg = {**CONFIGS["nvfp4_bf16"], **cfg}
        bm, g, iters = cfg["BM"], cfg["G"], cfg["ITERS"]
        grid = (_cdiv(n_groups, g), _row_tiles(n, bm * iters))
        extra = {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}
        _nvfp4_bf16_kernel[grid](x.view(torch.int32), data.view(torch.int32), scale.view(torch.uint8), global_scale,
                                 amax_bits, idx, n, n_groups, BM=bm, G=g, ITERS=iters, PREFETCH=bool(cfg["PREFETCH"]),
                                 INTERPRET=interpreting(), num_warps=cfg["num_warps"], **extra, **EXACT)
        return
    cfg = {**CONFIGS["nvfp4"], **cfg}
    bm, g = cfg["BM"], cfg["G"]
    grid = (_cdiv(n_groups, g), _row_tiles(n, bm))
    _nvfp4_kernel[grid](x, data, scale, global_scale, amax_bits, idx, n, k, n_groups, _cdiv(k, 2),
                        BM=bm, G=g, INTERPRET=interpreting(), num_warps=cfg["num_warps"], **EXACT)

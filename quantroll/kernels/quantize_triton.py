"""Triton kernels that quantize 2-D weights bit for bit as ``quantroll.formats`` does.

This module imports triton at the top; ``quantroll.kernels.quantize`` imports it only
when a kernel is launched, so the package works without triton.

Exactness, operation by operation (the reference is the CPU run of quantroll.formats):
- amax: max of |x|'s float32 bits as int32. For finite non-negative floats the integer
  order is the float order, so this is exact and knows nothing of denormal modes;
  NaN/Inf have bits >= 0x7F800000, so the same max flags a non-finite block for free.
- division x / d: exactly the fast path of ``div.rn.f32`` (IEEE round-to-nearest).
  ptxas expands div.rn.f32 into MUFU.RCP, one Newton step, q0 = x*y, r = fma(-d, q0, x),
  q = fma(y, r, q0), guarded by FCHK, which sends operands with extreme exponents
  (denormals, quotients near under/overflow) to a slow path. Here d is the same for a
  whole block (FP8) or group (NVFP4), so the reciprocal and its Newton step are done
  once per block. FP8 (and NVFP4 tensors of tiny values) scale each dividend by the
  power of two that brings the divisor into [1, 2), so that every dividend that can
  round to a non-zero code lies far from the denormal range, where the fast path is
  exact; NVFP4 scales the reciprocal instead, the same arithmetic up to exact powers
  of two (see _div_rn_recip). Three or four FP32 operations per element instead of
  ~12 and a branch; tests/kernels checks both against div.rn.f32 itself. Triton's plain ``/`` would be
  ``div.full.f32`` (about 2 ulp). Scalar divisions use ``tl.math.div_rn``; every
  launch passes ``enable_reflect_ftz=False`` so that it is ``div.rn.f32``, not
  ``div.rn.ftz.f32`` (which flushes subnormals), and ``enable_fp_fusion=False`` so that
  no multiply and add are contracted into an FMA that the reference does not do.
- powers of two: built from bits exactly as ``elements.pow2``.
- E4M3: clamp to +-448 (NaN-propagating, like torch.clamp), then ``.to(float8e4nv)``,
  which is round-to-nearest-even (``cvt.rn.satfinite.e4m3x2.f32`` on Hopper).
- E2M1: round-to-nearest-even from the bits (below 1: 2q + 2**23 rounds to an
  integer; from 1 on: round the mantissa to one bit), the same as the threshold
  comparisons of ``elements.e2m1_encode``.

Partial edge blocks load zeros for the missing part, which cannot raise an amax,
so every scale comes from the part of its block that exists.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from quantroll.errors import QuantrollError

# Compile options every launch passes (see the module docstring).
EXACT = {"enable_reflect_ftz": False, "enable_fp_fusion": False}

# Tile shapes and warps per format, measured on an H200 (docs/PERFORMANCE.md).
CONFIGS: dict[str, dict[str, int]] = {
    "fp8": {"num_warps": 4},
    "mxfp8": {"BM": 8, "G": 8, "num_warps": 2},
    "nvfp4": {"BM": 8, "G": 16, "num_warps": 2},
    "absmax": {"BLOCK": 4096, "num_warps": 8, "ctas_per_sm": 16},
}

@triton.jit
def _abs_bits(x):
    """|x| as int32 bits (float32 x): ordered like |x|; >= 0x7F800000 for NaN/Inf."""
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _clamp448(q):
    q = tl.maximum(q, -448.0, propagate_nan=tl.PropagateNan.ALL)
    return tl.minimum(q, 448.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _rcp_approx(d, INTERPRET: tl.constexpr):
    """MUFU.RCP, as div.rn.f32 starts (the CPU interpreter has no PTX: a rounded 1/d)."""
    if INTERPRET:
        return tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), d)
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [d], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _div_setup(d, INTERPRET: tl.constexpr):
    """For positive float32 divisors d (subnormals too): (p, s, dn, y) with dn = d*p*s in [1, 2)
    exactly (p, s powers of two) and y the Newton-refined reciprocal of dn that div.rn.f32 uses."""
    p = tl.where(d < 1.1754943508222875e-38, 18446744073709551616.0, 1.0)  # 2**64 lifts subnormals
    bits = (d * p).to(tl.int32, bitcast=True)
    k = (bits >> 23) - 127  # floor(log2(d * p)), in [-126, 127]
    dn = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    s = ((127 - k) << 23).to(tl.float32, bitcast=True)  # 2**-k: normal, as every divisor here is < 2**126
    y0 = _rcp_approx(dn, INTERPRET)
    y = tl.fma(y0, tl.fma(-dn, y0, 1.0), y0)
    return p, s, dn, y


@triton.jit
def _div_rn_pos(a, p, s, dn, y, INTERPRET: tl.constexpr):
    """RN(a / d) for a >= 0, given _div_setup(d): div.rn.f32's fast path on (a*p*s, dn).

    a*p*s is exact unless it underflows, and then the quotient is below 2**-125: every
    format rounds it to a zero code, as it does the exact quotient. (The interpreter's
    fma is not fused, so there it divides.)"""
    a = (a * p) * s
    if INTERPRET:
        return tl.math.div_rn(a, dn)
    else:
        q0 = a * y
        r = tl.fma(-dn, q0, a)
        return tl.fma(y, r, q0)


@triton.jit
def _recip_scaled(d, INTERPRET: tl.constexpr):
    """For a divisor d in [2**-99, 2**126): Y = y * 2**-k, where d = dn * 2**k with dn in
    [1, 2) and y is div.rn.f32's Newton-refined reciprocal of dn (exact scaling)."""
    bits = d.to(tl.int32, bitcast=True)
    k = (bits >> 23) - 127
    dn = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    y0 = _rcp_approx(dn, INTERPRET)
    y = tl.fma(y0, tl.fma(-dn, y0, 1.0), y0)
    return y * ((127 - k) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _div_rn_recip(a, d, Y, INTERPRET: tl.constexpr):
    """RN(a / d) for a >= 0 with d in [2**-99, 2**126) and Y = _recip_scaled(d), wherever the
    quotient is at least 2**-3; a smaller quotient comes out below 0.25 (E2M1 code 0).

    Each step is div.rn.f32's fast path on (a * 2**-k, dn) scaled by a power of two:
    q0 = RN(a * Y) is the same real product; the residual a - d*q0 = 2**k * (its residual)
    is a multiple of 2**(k - 50) >= 2**-149 when the quotient is >= 2**-3, so exact; and
    Y * r = y * (its residual). Three operations per element, no per-element scaling."""
    if INTERPRET:
        return tl.math.div_rn(a, d)
    else:
        q0 = a * Y
        r = tl.fma(-d, q0, a)
        return tl.fma(Y, r, q0)


@triton.jit
def _div_check_kernel(a_ptr, d_ptr, fast_ptr, ref_ptr, n, BLOCK: tl.constexpr, MODE: tl.constexpr):
    """Test hook: the hoisted divisions (MODE 0: _div_rn_pos, 1: _div_rn_recip) against
    tl.math.div_rn (div.rn.f32) on the same operands."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=0.0)
    d = tl.load(d_ptr + offs, mask=m, other=1.0)
    if MODE == 0:
        p, s, dn, y = _div_setup(d, False)
        fast = _div_rn_pos(a, p, s, dn, y, False)
    else:
        fast = _div_rn_recip(a, d, _recip_scaled(d, False), False)
    tl.store(fast_ptr + offs, fast, mask=m)
    tl.store(ref_ptr + offs, tl.math.div_rn(a, d), mask=m)


def div_check(a: torch.Tensor, d: torch.Tensor, mode: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(fast, reference) quotients of float32 CUDA tensors a >= 0, d > 0 (for the GPU tests)."""
    fast, ref = torch.empty_like(a), torch.empty_like(a)
    n = a.numel()
    _div_check_kernel[(_cdiv(n, 1024),)](a, d, fast, ref, n, BLOCK=1024, MODE=mode, **EXACT)
    return fast, ref


@triton.jit(do_not_specialize=["flag_idx", "N"])
def _fp8_block_kernel(x_ptr, q_ptr, s_ptr, flag_ptr, flag_idx, N, K, n_kb,
                      BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """One 128x128 block per program: amax -> scale = amax/448 -> e4m3(x / scale)."""
    pk = tl.program_id(0)  # block column (consecutive programs walk along the rows' memory)
    pm = tl.program_id(1)  # block row
    rows = pm * BLOCK + tl.arange(0, BLOCK)
    cols = pk * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < N)[:, None] & (cols < K)[None, :]
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    xbits = x.to(tl.int32, bitcast=True)
    abits = xbits & 0x7FFFFFFF
    amax_bits = tl.max(abits)
    tl.store(flag_ptr + flag_idx, 1, mask=amax_bits >= 0x7F800000)
    amax = amax_bits.to(tl.float32, bitcast=True)
    scale = tl.math.div_rn(amax, 448.0)
    scale = tl.where(scale < 1.1754943508222875e-38, 1.1754943508222875e-38, scale)  # FP32_TINY
    divisor = tl.where(amax_bits > 0, scale, 1.0)
    scale = tl.where(amax_bits > 0, scale, 0.0)
    _, s, dn, y = _div_setup(divisor, INTERPRET)  # divisor >= FP32_TINY: no lift needed (p = 1)
    q = _div_rn_pos(abits.to(tl.float32, bitcast=True), 1.0, s, dn, y, INTERPRET)
    q = tl.minimum(q, 448.0, propagate_nan=tl.PropagateNan.ALL)
    q = (q.to(tl.int32, bitcast=True) | (xbits & -2147483648)).to(tl.float32, bitcast=True)  # sign of x
    tl.store(q_ptr + offs, q.to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + pm * n_kb + pk, scale)  # scale is [n_mb, n_kb] row-major


@triton.jit(do_not_specialize=["flag_idx", "N"])
def _mxfp8_kernel(x_ptr, q_ptr, s_ptr, flag_ptr, flag_idx, N, K, n_groups,
                  BM: tl.constexpr, G: tl.constexpr, CEIL: tl.constexpr):
    """A [BM rows] x [G groups of 32] tile per program; one E8M0 scale per group."""
    GS: tl.constexpr = 32
    pk = tl.program_id(0)  # group tile (consecutive programs walk along the rows' memory)
    pm = tl.program_id(1)  # row tile
    rows = pm * BM + tl.arange(0, BM)
    gidx = pk * G + tl.arange(0, G)
    cols = gidx[:, None] * GS + tl.arange(0, GS)[None, :]
    rmask = rows < N
    mask = rmask[:, None, None] & (cols < K)[None, :, :]
    offs = rows.to(tl.int64)[:, None, None] * K + cols[None, :, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    gbits = tl.max(_abs_bits(x), axis=2)  # [BM, G] amax bits
    tl.store(flag_ptr + flag_idx, 1, mask=tl.max(gbits) >= 0x7F800000)
    # s = floor(log2(amax)) - 8 (+1 under 'ceil' when the mantissa exceeds 1.75)
    s = (gbits >> 23) - (127 + 8)
    if CEIL:
        s += ((gbits & 0x7FFFFF) > 0x600000).to(tl.int32)
    s = tl.minimum(tl.maximum(s, -127), 127)
    s = tl.where(gbits > 0, s, -127)
    e = -s  # inverse scale 2**e, exact from bits (2**-127 is the one subnormal)
    inv = tl.where(e >= -126, (e + 127) << 23, 0x00400000).to(tl.float32, bitcast=True)
    q = _clamp448(x * tl.broadcast_to(inv[:, :, None], (BM, G, GS)))
    tl.store(q_ptr + offs, q.to(tl.float8e4nv), mask=mask)
    soffs = rows.to(tl.int64)[:, None] * n_groups + gidx[None, :]
    tl.store(s_ptr + soffs, (s + 127).to(tl.uint8), mask=rmask[:, None] & (gidx < n_groups)[None, :])


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


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _row_tiles(n: int, bm: int) -> int:
    tiles = _cdiv(n, bm)
    if tiles > 65535:  # CUDA's limit on the grid's second dimension
        raise QuantrollError(f"a weight of {n} rows is more than this kernel's grid takes ({65535 * bm})")
    return tiles


_SM_COUNT: dict = {}


def _sm_count(x: torch.Tensor) -> int:
    if x.device.type != "cuda":
        return 4  # the CPU interpreter
    if x.device not in _SM_COUNT:
        _SM_COUNT[x.device] = torch.cuda.get_device_properties(x.device).multi_processor_count
    return _SM_COUNT[x.device]


def launch_fp8(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, flags: torch.Tensor, idx: int, **cfg) -> None:
    """x [N, K] contiguous -> data [N, K] e4m3, scale [ceil(N/128), ceil(K/128)] f32; flags[idx] = 1 on NaN/Inf."""
    cfg = {**CONFIGS["fp8"], **cfg}
    n, k = x.shape
    n_kb = _cdiv(k, 128)
    grid = (n_kb, _row_tiles(n, 128))
    _fp8_block_kernel[grid](x, data, scale, flags, idx, n, k, n_kb, BLOCK=128, INTERPRET=_interpret(),
                            num_warps=cfg["num_warps"], **EXACT)


def launch_mxfp8(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, flags: torch.Tensor, idx: int,
                 ceil: bool, **cfg) -> None:
    """x [N, K] -> data [N, K] e4m3, scale [N, ceil(K/32)] E8M0 uint8; flags[idx] = 1 on NaN/Inf."""
    cfg = {**CONFIGS["mxfp8"], **cfg}
    n, k = x.shape
    bm, g = cfg["BM"], cfg["G"]
    n_groups = _cdiv(k, 32)
    grid = (_cdiv(n_groups, g), _row_tiles(n, bm))
    _mxfp8_kernel[grid](x, data, scale, flags, idx, n, k, n_groups, BM=bm, G=g, CEIL=bool(ceil),
                        num_warps=cfg["num_warps"], **EXACT)


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


def launch_nvfp4(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor,
                 amax_bits: torch.Tensor, idx: int, **cfg) -> None:
    """Pass 2 (after launch_absmax): data [N, ceil(K/2)] packed uint8, scale [N, ceil(K/16)] e4m3."""
    cfg = {**CONFIGS["nvfp4"], **cfg}
    n, k = x.shape
    bm, g = cfg["BM"], cfg["G"]
    n_groups = _cdiv(k, 16)
    grid = (_cdiv(n_groups, g), _row_tiles(n, bm))
    _nvfp4_kernel[grid](x, data, scale, global_scale, amax_bits, idx, n, k, n_groups, _cdiv(k, 2),
                        BM=bm, G=g, INTERPRET=_interpret(), num_warps=cfg["num_warps"], **EXACT)

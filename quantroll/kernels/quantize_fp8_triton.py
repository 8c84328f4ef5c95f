"""Block FP8 (128x128) and MXFP8 (1x32, E8M0) weight quantization kernels and launchers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantroll.kernels.launch import interpreting
from quantroll.kernels.quantize_triton_common import (
    CONFIGS, EXACT, _abs_bits, _cdiv, _clamp448, _div_rn_pos, _div_setup, _row_tiles)


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


def launch_fp8(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, flags: torch.Tensor, idx: int, **cfg) -> None:
    """x [N, K] contiguous -> data [N, K] e4m3, scale [ceil(N/128), ceil(K/128)] f32; flags[idx] = 1 on NaN/Inf."""
    cfg = {**CONFIGS["fp8"], **cfg}
    n, k = x.shape
    n_kb = _cdiv(k, 128)
    grid = (n_kb, _row_tiles(n, 128))
    _fp8_block_kernel[grid](x, data, scale, flags, idx, n, k, n_kb, BLOCK=128, INTERPRET=interpreting(),
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

"""Exact float32 arithmetic for the quantize kernels (see quantize_triton.py for why each
operation is bit-identical to the reference), the compile options and tile settings every
launch uses, and small launch helpers shared by the per-format kernel modules."""

from __future__ import annotations


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
    "nvfp4": {"BM": 8, "G": 16, "num_warps": 2},  # generic pass 2 (float16/float32, K % 16 != 0)
    "nvfp4_bf16": {"BM": 8, "G": 16, "num_warps": 2, "ITERS": 8, "PREFETCH": True},  # bf16 pass 2
    "absmax": {"BLOCK": 4096, "num_warps": 8, "ctas_per_sm": 8},
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
def _refined_quotient(a, d, y, INTERPRET: tl.constexpr):
    """div.rn.f32's fast path for a / d given y, a reciprocal of d within an ulp: q0 = RN(a*y),
    then one correction by the exact residual a - d*q0 (the interpreter's fma is not fused,
    so there it divides)."""
    if INTERPRET:
        return tl.math.div_rn(a, d)
    else:
        q0 = a * y
        r = tl.fma(-d, q0, a)
        return tl.fma(y, r, q0)


@triton.jit
def _div_rn_pos(a, p, s, dn, y, INTERPRET: tl.constexpr):
    """RN(a / d) for a >= 0, given _div_setup(d): div.rn.f32's fast path on (a*p*s, dn).

    a*p*s is exact unless it underflows, and then the quotient is below 2**-125: every
    format rounds it to a zero code, as it does the exact quotient."""
    return _refined_quotient((a * p) * s, dn, y, INTERPRET)


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
    return _refined_quotient(a, d, Y, INTERPRET)


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


@triton.jit
def _div_setup_normal(d, INTERPRET: tl.constexpr):
    """_div_setup for a positive normal float32 d below 2**127 (no lift needed, p = 1):
    (s, dn, y), dn = d*s in [1, 2); _div_rn_pos(a, 1.0, s, dn, y) is then RN(a / d)."""
    bits = d.to(tl.int32, bitcast=True)
    dn = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    s = (0x7F000000 - (bits & 0x7F800000)).to(tl.float32, bitcast=True)  # 2**-k, k = floor(log2 d)
    y0 = _rcp_approx(dn, INTERPRET)
    y = tl.fma(y0, tl.fma(-dn, y0, 1.0), y0)
    return s, dn, y


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

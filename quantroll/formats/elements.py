"""Element formats (E4M3, E2M1, E8M0) as exact, pure tensor functions.

Every function here is a definition that the GPU kernels must reproduce bit for bit,
so each one is written with operations whose results are exactly specified by IEEE
754 (comparisons, max, correctly rounded division, multiplication by powers of two,
integer bit manipulation). Nothing here depends on what a cast does with values out
of range: callers saturate explicitly first (torch versions disagree about overflow).
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9
E4M3_MIN_NORMAL = 2.0**-6
E2M1_MAX = 6.0
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
E8M0_BIAS = 127
FP32_TINY = torch.finfo(torch.float32).tiny

# E2M1 magnitudes by 3-bit code; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def div_exact(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor, correctly rounded on every device.

    Dividing a CUDA tensor by a Python scalar makes torch multiply by the rounded
    reciprocal, which differs from true division in the last bit; a tensor divisor
    keeps IEEE division on CPU and GPU alike (and matches the kernels' div_rn).
    """
    return x / torch.full_like(x, divisor)


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """Exact float32 2**e for integer e in [-127, 127], built from the bit pattern.

    exp2/ldexp are not guaranteed exact on every backend; a bit pattern is.
    2**-127 is a float32 subnormal (bit 22 set), every other exponent is normal.
    """
    e = exponent.to(torch.int32)
    normal = ((e + 127).clamp(min=1) << 23).view(torch.float32)
    subnormal = torch.full_like(normal, 2.0**-127)
    return torch.where(e >= -126, normal, subnormal)


def floor_log2(x: torch.Tensor) -> torch.Tensor:
    """floor(log2(x)) for positive normal float32 x, from the exponent bits (int32).

    Zero and subnormals give -127, which every caller clamps to anyway.
    """
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF) - 127


def mantissa_bits(x: torch.Tensor) -> torch.Tensor:
    """The 23 stored mantissa bits of float32 x (int32)."""
    return x.to(torch.float32).contiguous().view(torch.int32) & 0x7FFFFF


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to float8_e4m3fn, nearest-even, saturating at +-448 explicitly."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def e4m3_ulp(values: torch.Tensor) -> torch.Tensor:
    """Spacing of E4M3 numbers at each value (float32): 2**(floor(log2|v|) - 3).

    Below the smallest normal (2**-6) the spacing is the subnormal step 2**-9. For a
    value on a power of two this is the spacing above it, which bounds the rounding
    error from either side.
    """
    a = values.to(torch.float32).abs()
    ulp = pow2((floor_log2(a) - 3).clamp(min=-9))
    return torch.where(a < E4M3_MIN_NORMAL, torch.full_like(a, E4M3_MIN_SUBNORMAL), ulp)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to E2M1 codes (uint8 in 0..15), nearest-even, saturating at 6.

    The magnitude code is the number of rounding thresholds that |x| passes. At a tie
    the threshold counts only when the upper neighbour has the even code: 0.75 -> 1.0
    (code 2), 1.75 -> 2.0 (code 4), 3.5 -> 4.0 (code 6); 0.25, 1.25, 2.5 and 5.0 stay
    down. The sign bit follows signbit(x), so -0.0 and tiny negatives keep their sign.
    """
    a = x.abs()
    mag = (
        (a > 0.25).to(torch.uint8)
        + (a >= 0.75).to(torch.uint8)
        + (a > 1.25).to(torch.uint8)
        + (a >= 1.75).to(torch.uint8)
        + (a > 2.5).to(torch.uint8)
        + (a >= 3.5).to(torch.uint8)
        + (a > 5.0).to(torch.uint8)
    )
    return mag | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) to float32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -mag, mag)


def e2m1_ulp(codes: torch.Tensor) -> torch.Tensor:
    """Spacing of E2M1 numbers at each code: 0.5 below 2, 1 in [2, 4), 2 from 4 on."""
    mag = (codes & 0x7).to(torch.int32)
    return torch.where(mag >= 6, 2.0, torch.where(mag >= 4, 1.0, 0.5)).to(torch.float32)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes two per byte along the last dim: element 2i low, 2i+1 high.

    An odd last dimension is padded with a zero code.
    """
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor, length: int) -> torch.Tensor:
    """Inverse of pack_nibbles, cut to ``length`` codes along the last dim."""
    low = packed & 0x0F
    high = packed >> 4
    codes = torch.stack((low, high), dim=-1).flatten(-2)
    return codes[..., :length]


def e8m0_encode(exponent: torch.Tensor) -> torch.Tensor:
    """Integer exponents in [-127, 127] to biased E8M0 bytes (uint8; 255 is NaN)."""
    return (exponent.to(torch.int32) + E8M0_BIAS).to(torch.uint8)


def e8m0_decode(biased: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes to exact float32 powers of two (255 -> NaN)."""
    value = pow2(biased.to(torch.int32) - E8M0_BIAS)
    return torch.where(biased == 255, torch.full_like(value, float("nan")), value)

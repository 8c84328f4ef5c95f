"""Triton kernels that quantize 2-D weights bit for bit as ``quantroll.formats`` does.

These modules import triton at the top; ``quantroll.kernels.quantize`` imports them
only when a kernel is launched, so the package works without triton.

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
  comparisons of ``elements.e2m1_encode`` (tests/kernels checks every float32 below 11).
- NVFP4 pass 2 for bf16 rows of whole groups (the weight sync's case) reads the weight
  as int32 words of two bf16: the group amax is a max over the 16-bit magnitudes
  (max.u16x2, exact as the float bits are), the sign bits of 8 codes are gathered by
  byte permutes (prmt), the division by the global scale is hoisted per program, and
  e4m3(max(t, 2**-9)) with the saturating cast replaces clamp + cast + the zero-scale
  fix (rounding is monotone). Other inputs take the generic kernel.

Partial edge blocks load zeros for the missing part, which cannot raise an amax,
so every scale comes from the part of its block that exists.

The kernels live in one module per format, on shared exact-arithmetic helpers:
quantize_triton_common.py (division, clamps, compile options, tile settings),
quantize_fp8_triton.py (block FP8, MXFP8), quantize_nvfp4_triton.py (NVFP4). This module
gathers their launchers for ``quantroll.kernels.quantize`` and the benchmarks.
"""

from __future__ import annotations

from quantroll.kernels.quantize_fp8_triton import launch_fp8, launch_mxfp8
from quantroll.kernels.quantize_nvfp4_triton import e2m1_check, launch_absmax, launch_nvfp4, nvfp4_bf16_path
from quantroll.kernels.quantize_triton_common import CONFIGS, EXACT, div_check

__all__ = ["CONFIGS", "EXACT", "div_check", "e2m1_check", "launch_absmax", "launch_fp8", "launch_mxfp8", "launch_nvfp4",
           "nvfp4_bf16_path"]

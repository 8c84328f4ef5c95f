// silu(gate) * up and its 1x128 FP8 quantization, per value, with the results of the
// Triton kernel (fused_triton.silu_mul_kernel with QUANT), bit for bit. Its sm_90 PTX:
// -g as mul.f32 by -log2(e) (Triton 3.8) or sub.f32 0, g then mul.f32 by log2(e) (3.6),
// ex2.approx.f32, add.f32 1, div.full.f32, cvt.rn.bf16.f32, then mul.bf16 by up (one
// rounding of the exact product, which mul.f32 + cvt.rn.bf16.f32 reproduces: a product of
// two BF16 values is exact in float32); then div.rn.f32 for amax / 448 and for x / scale,
// a clamp to +-448 and cvt.rn.satfinite.e4m3x2.f32. The -g forms differ only at g = +0,
// where ex2 gives 1 either way; the denominator of div.full is >= 1, away from the paths
// where ptxas versions expand div.full differently. A GEMM that computes its own input
// with these gets the codes and scales the separate kernels would have handed it
// (tests/kernels/test_fp8_wgmma.py compares them over every BF16 gate value; re-run after
// a Triton or CUDA upgrade). Explicit-rounding intrinsics keep ptxas from contracting a
// mul and an add into an fma, which Triton's PTX does not have either. Pure and per thread.

#pragma once

#include <stdint.h>

namespace quantroll_silu {

constexpr float FP32_TINY = 1.1754943508222875e-38f;  // smallest normal float32

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

__device__ __forceinline__ float round_bf16(float x) {
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return bf16_bits_to_f32(h);
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float div_full(float a, float b) {
  float y;
  asm("div.full.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

// bf16(bf16(g / (1 + exp(-g))) * u) for BF16 inputs g, u (as float32).
__device__ __forceinline__ float silu_mul(float g, float u) {
  const float e = ex2_approx(__fmul_rn(g, -1.4426950408889634f));
  const float act = round_bf16(div_full(g, __fadd_rn(e, 1.0f)));
  return round_bf16(__fmul_rn(act, u));
}

// The scale of a group whose largest |value| is amax (0 for an all-zero group).
__device__ __forceinline__ float group_scale(float amax) {
  const float scale = fmaxf(__fdiv_rn(amax, 448.0f), FP32_TINY);
  return amax > 0.0f ? scale : 0.0f;
}

// Two values' e4m3 codes under a group's scale, as one 16-bit pair (x0 in the low byte).
__device__ __forceinline__ uint32_t quantize_pair(float x0, float x1, float scale) {
  const float divisor = scale > 0.0f ? scale : 1.0f;
  const float q0 = fminf(fmaxf(__fdiv_rn(x0, divisor), -448.0f), 448.0f);
  const float q1 = fminf(fmaxf(__fdiv_rn(x1, divisor), -448.0f), 448.0f);
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(q1), "f"(q0));  // first operand: high byte
  return pair;
}

}  // namespace quantroll_silu

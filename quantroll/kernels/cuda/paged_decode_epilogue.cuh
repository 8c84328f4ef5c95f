// The epilogue of the FP8-cache decode attention in paged_decode_fp8.cu: the output of a
// block's heads: BF16, or E4M3 codes and a scale per head for a block-FP8 o_proj.

#pragma once

#include "gemv_fragments.cuh"
#include "paged_decode_stage.cuh"

namespace quantroll_paged {

using quantroll_gemv::f32_to_bf16_rne;

// The attention output of the block's heads: value(row, col) is head row's dim col before
// rounding; stored as BF16, or (`codes` not null) handed to a block-FP8 o_proj, each head one
// 1x128 group: E4M3 codes and one scale, bit for bit what act_quant_fp8_kernel makes of the
// BF16 output. red_amax: WARPS floats of shared memory.
template <int WARPS, typename Value>
__device__ __forceinline__ void emit(const Value& value, int g, int kvh, long long b, int lane, int warp,
                                     float* red_amax, uint16_t* __restrict__ out, long long s_ob, long long s_oh,
                                     uint8_t* __restrict__ codes, float* __restrict__ code_scales, long long s_cb,
                                     long long s_csg) {
  if (codes == nullptr) {
    for (int idx = threadIdx.x; idx < g * D; idx += WARPS * 32) {
      const int row = idx / D, col = idx % D;
      out[b * s_ob + (static_cast<long long>(kvh) * g + row) * s_oh + col] = f32_to_bf16_rne(value(row, col));
    }
    return;
  }
  constexpr int PER_THREAD = D / (WARPS * 32);
  for (int row = 0; row < g; ++row) {
    float v[PER_THREAD], amax = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
      v[k] = bf16_to_f32(f32_to_bf16_rne(value(row, threadIdx.x + k * WARPS * 32)));  // the BF16 output
      amax = fmaxf(amax, fabsf(v[k]));
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, x));
    if (lane == 0) red_amax[warp] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < WARPS; ++w) amax = fmaxf(amax, red_amax[w]);
    __syncthreads();  // red_amax is rewritten for the next head
    // act_quant_fp8_kernel's math, op for op (fused_triton._quant_fp8_groups)
    float scale = fmaxf(__fdiv_rn(amax, 448.0f), FP32_TINY);
    scale = amax > 0.0f ? scale : 0.0f;
    const float divisor = scale > 0.0f ? scale : 1.0f;
    const long long head = static_cast<long long>(kvh) * g + row;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
      const float x = fminf(fmaxf(__fdiv_rn(v[k], divisor), -448.0f), 448.0f);
      codes[b * s_cb + head * D + threadIdx.x + k * WARPS * 32] = e4m3_of(x);
    }
    if (threadIdx.x == 0) code_scales[b + head * s_csg] = scale;
  }
}

}  // namespace quantroll_paged

// The epilogue of the FP8-cache decode attention in paged_decode_fp8.cu: the output of a
// block's heads (BF16, or E4M3 codes and a scale per head for a block-FP8 o_proj), and the
// merge of a (sequence, KV head)'s splits by the last of its blocks to finish.

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
__device__ __forceinline__ void emit(const Value& value, int row_begin, int row_end, int g, int kvh, long long b,
                                     int lane, int warp,
                                     float* red_amax, uint16_t* __restrict__ out, long long s_ob, long long s_oh,
                                     uint8_t* __restrict__ codes, float* __restrict__ code_scales, long long s_cb,
                                     long long s_csg) {
  if (codes == nullptr) {
    for (int idx = row_begin * D + threadIdx.x; idx < row_end * D; idx += WARPS * 32) {
      const int row = idx / D, col = idx % D;
      out[b * s_ob + (static_cast<long long>(kvh) * g + row) * s_oh + col] = f32_to_bf16_rne(value(row, col));
    }
    return;
  }
  constexpr int PER_THREAD = D / (WARPS * 32);
  for (int row = row_begin; row < row_end; ++row) {
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

// The dynamic shared memory of a WARPS block in floats (paged_decode_cuda.shared_bytes): the
// warps' two stages, or the final reduction's [WARPS][16][D] + [WARPS][16][2] + [WARPS].
template <int WARPS>
constexpr int SHARED_FLOATS = (WARPS * 2 * STAGE > WARPS * 16 * (D + 2) * 4 + WARPS * 4 ? WARPS * 2 * STAGE
                                                                                         : WARPS * 16 * (D + 2) * 4 + WARPS * 4) / 4;

// The merge of a (sequence, KV head)'s splits, by the last of its blocks to finish: the
// partials of a pass of heads are read into shared memory with all their loads in flight at
// once (one L2 round trip, not one per split and output), as many heads a pass as the block's
// shared memory holds (paged_decode_cuda.max_splits caps the splits so that one head fits).
// Per head: the log-sum-exp weights w_s = l_s exp(m_s - max m) of its non-empty splits and
// their sum, then out = sum_s w_s (O / l)_s / sum_s w_s, as merge_splits_kernel computes it.
// `first`: the partials' index of (head 0 of this KV head, split 0); `smem`: the block's
// dynamic shared memory, free by now.
template <int WARPS>
__device__ __forceinline__ void merge_staged(char* smem, const float* __restrict__ part_o,
                                             const float* __restrict__ part_ml, long long first, long long splits,
                                             int g, int kvh, long long b, int lane, int warp,
                                             uint16_t* __restrict__ out, long long s_ob, long long s_oh,
                                             uint8_t* __restrict__ codes, float* __restrict__ code_scales,
                                             long long s_cb, long long s_csg) {
  constexpr int THREADS = WARPS * 32;
  const int ns = static_cast<int>(splits);
  const int per_pass = min(g, (SHARED_FLOATS<WARPS> - WARPS) / (ns * (D + 2) + 1));
  for (int r0 = 0; r0 < g; r0 += per_pass) {
    const int rows = min(per_pass, g - r0);
    float* stage_o = reinterpret_cast<float*>(smem);  // [rows][splits][D]
    float* stage_w = stage_o + rows * ns * D;         // [rows][splits][2]: (m, l), then (w, -)
    float* stage_den = stage_w + rows * ns * 2;       // [rows]
    const float4* src = reinterpret_cast<const float4*>(part_o + (first + r0 * ns) * D);
    const float* src_ml = part_ml + (first + r0 * ns) * 2;
    const int n4 = rows * ns * D / 4, nml = rows * ns * 2;
    for (int i0 = threadIdx.x; i0 < n4 + nml; i0 += 4 * THREADS) {
      float4 o[4];
      float ml[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // four loads in flight per thread before any store
        const int i = i0 + k * THREADS;
        if (i < n4) o[k] = __ldcg(src + i);
        else if (i < n4 + nml) ml[k] = __ldcg(src_ml + (i - n4));
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = i0 + k * THREADS;
        if (i < n4) reinterpret_cast<float4*>(stage_o)[i] = o[k];
        else if (i < n4 + nml) stage_w[i - n4] = ml[k];
      }
    }
    __syncthreads();
    if (threadIdx.x < rows) {
      float* ml = stage_w + threadIdx.x * ns * 2;
      float m_all = -INFINITY, den = 0.0f;
      for (int sp = 0; sp < ns; ++sp) {
        if (ml[sp * 2 + 1] > 0.0f) m_all = fmaxf(m_all, ml[sp * 2]);
      }
      for (int sp = 0; sp < ns; ++sp) {
        const float l = ml[sp * 2 + 1];
        const float w = l > 0.0f ? l * expf(ml[sp * 2] - m_all) : 0.0f;
        den += w;
        ml[sp * 2] = w;
      }
      stage_den[threadIdx.x] = den;
    }
    __syncthreads();
    emit<WARPS>([&](int row, int col) {
      const int rr = row - r0;
      float num = 0.0f;
      for (int sp = 0; sp < ns; ++sp) num += stage_w[(rr * ns + sp) * 2] * stage_o[(rr * ns + sp) * D + col];
      return num / stage_den[rr];
    }, r0, r0 + rows, g, kvh, b, lane, warp, stage_den + rows, out, s_ob, s_oh, codes, code_scales, s_cb, s_csg);
    __syncthreads();  // the next pass restages
  }
}

}  // namespace quantroll_paged

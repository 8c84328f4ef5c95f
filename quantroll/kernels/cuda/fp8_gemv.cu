// Block-FP8 decode GEMM for a few token rows (M <= 8 * MT): y = (a_q * a_s) @ (w_q * w_s)^T,
// 1x128 activation scales, 128x128 weight scales, BF16 output, float32-accurate.
//
// Why CUDA and not Triton: at decode sizes the GEMM is a stream of weight bytes, and what
// limits it is how many bytes each multiprocessor keeps in flight and how little each
// launch pays before the first byte arrives. Here every thread loads its weight bytes
// with 16-byte loads straight into the registers that mma.sync reads (no shared-memory
// staging, no ldmatrix), widens the e4m3 codes to float16 (exact) and multiplies on
// mma.sync.m16n8k16 with float32 accumulation, so products are exact and sums are float32.
//
// Layout of the work: a block owns 16 * RT weight rows and all of K; its WARPS warps take the
// 128-wide K groups round-robin (group g to warp g % WARPS) and are summed through shared
// memory in warp order at the end: one launch, no cross-block reduction, and the same
// result on every run. The K order inside a group is free (a dot product does not care),
// so each thread reads 32 contiguous bytes of its row per group and the token codes in
// the same order: thread (r, t) = (lane / 4, lane % 4) holds weight rows r and r + 8 (of
// each of the block's 16-row tiles) and logical k = 32 t + 4 j + {0..3} for mma step
// j = 0..7, whose A slots (2t, 2t+1) take k + {0, 1} and slots (2t+8, 2t+9) take
// k + {2, 3}; the B fragment (token codes) uses the same map, token row r + 8 * tile.
//
// Launch: each warp requests its first round of weight bytes, lets the next kernel launch
// and waits for the previous one (programmatic dependent launch, see fp8_gemv.py), and
// only then reads the token codes. PIPELINE: two register buffers, the next round's loads
// in flight while this round multiplies.

#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

template <int MT, int RT, int WARPS, int UNROLL, bool PIPELINE>
__device__ __forceinline__ void fp8_gemv(const uint8_t* a_q, long long a_stride,
                                         const float* a_s, long long a_s_stride_m,
                                         long long a_s_stride_g, const uint8_t* __restrict__ w_q,
                                         long long w_stride, const float* __restrict__ w_s,
                                         long long w_s_stride_n, long long w_s_stride_g,
                                         uint16_t* __restrict__ y, long long y_stride, long long m_rows,
                                         long long k) {
  constexpr int ROWS = 16 * RT;  // weight rows of the block (within one 128-row scale block)
  __shared__ float partial[WARPS][ROWS][partial_row<MT>()];

  Place<MT> at(ROWS, w_q, w_stride, a_q, a_stride, m_rows, k);
  const int warp = at.warp, groups = at.groups;
  const uint8_t* w_row0 = at.w_row0;
  const float* w_s_block = w_s + (at.n0 >> 7) * w_s_stride_n;
  float total[RT][MT][4];
  zero(total);

  // One round: UNROLL groups (first, first + WARPS, ...) of this warp.
  constexpr int STEP = WARPS * UNROLL;
  auto load_round = [&](Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) load_weights<MT, RT, false>(grp[u], w_row0, w_stride, static_cast<long long>(g) << 7);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) load_tokens<MT, RT>(grp[u], at.a_rows, static_cast<long long>(g) << 7);
    }
  };
  auto multiply_round = [&](const Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) {
        float acc[RT][MT][4];
        multiply_group<MT, RT>(grp[u], acc);
        add_scaled<MT, RT>(total, acc, a_s, at.scale_rows, a_s_stride_m, a_s_stride_g, g,
                           w_s_block[g * w_s_stride_g]);
      }
    }
  };

  // The first round's weight bytes are requested before waiting for the previous kernel.
  Group<MT, RT> cur[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int g = warp + u * WARPS;
    if (g < groups) load_weights<MT, RT, true>(cur[u], w_row0, w_stride, static_cast<long long>(g) << 7);
  }
  allow_next_grid();
  wait_for_previous_grid();
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) at.a_rows[tile] = after_wait(at.a_rows[tile]);
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int g = warp + u * WARPS;
    if (g < groups) load_tokens<MT, RT>(cur[u], at.a_rows, static_cast<long long>(g) << 7);
  }

  if (PIPELINE) {
    // Two register buffers: the next round's loads are in flight while this one multiplies.
    Group<MT, RT> nxt[UNROLL];
    for (int first = warp; first < groups; first += 2 * STEP) {
      if (first + STEP < groups) load_round(nxt, first + STEP);
      multiply_round(cur, first);
      if (first + STEP >= groups) break;
      if (first + 2 * STEP < groups) load_round(cur, first + 2 * STEP);
      multiply_round(nxt, first + STEP);
    }
  } else {
    for (int first = warp; first < groups; first += STEP) {
      if (first != warp) load_round(cur, first);
      multiply_round(cur, first);
    }
  }

  reduce_and_store<MT, RT, WARPS>(partial, total, y, y_stride, at.n0, at.last_row);
}

}  // namespace

#define QUANTROLL_FP8_GEMV(MT, RT, WARPS, UNROLL, PIPELINE)                                                \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                 \
      fp8_gemv_mt##MT##_rt##RT##_w##WARPS##_u##UNROLL##_p##PIPELINE(                                       \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride,                 \
          long long m_rows, long long k) {                                                                 \
    fp8_gemv<MT, RT, WARPS, UNROLL, PIPELINE>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s, \
                                              w_s_stride_n, w_s_stride_g, y, y_stride, m_rows, k);         \
  }

// The compiled variants (fp8_gemv.py's VARIANTS names them; bench/gemv_cuda.py times them):
// the chosen ones, their one-row-tile twins, and the runners-up of the 2026-12-01 sweep.
QUANTROLL_FP8_GEMV(1, 1, 8, 1, 1)
QUANTROLL_FP8_GEMV(1, 2, 8, 1, 1)
QUANTROLL_FP8_GEMV(1, 2, 8, 2, 0)
QUANTROLL_FP8_GEMV(1, 1, 8, 2, 0)
QUANTROLL_FP8_GEMV(1, 2, 4, 2, 0)
QUANTROLL_FP8_GEMV(1, 2, 4, 1, 1)
QUANTROLL_FP8_GEMV(1, 1, 8, 2, 1)
QUANTROLL_FP8_GEMV(2, 1, 8, 1, 1)
QUANTROLL_FP8_GEMV(2, 1, 4, 1, 1)
QUANTROLL_FP8_GEMV(2, 1, 4, 2, 0)
QUANTROLL_FP8_GEMV(2, 2, 8, 1, 0)
QUANTROLL_FP8_GEMV(2, 1, 8, 2, 0)
QUANTROLL_FP8_GEMV(2, 1, 8, 1, 0)
QUANTROLL_FP8_GEMV(2, 2, 4, 1, 1)
QUANTROLL_FP8_GEMV(2, 2, 8, 1, 1)
QUANTROLL_FP8_GEMV(2, 1, 4, 2, 1)
QUANTROLL_FP8_GEMV(4, 1, 4, 1, 0)
QUANTROLL_FP8_GEMV(4, 1, 4, 1, 1)
QUANTROLL_FP8_GEMV(8, 1, 4, 1, 0)

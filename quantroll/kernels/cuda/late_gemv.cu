#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

template <int MT, int RT, int WARPS, int UNROLL, bool PIPELINE>
__device__ __forceinline__ void fp8_gemv_late(const uint8_t* a_q, long long a_stride,
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
  };
  auto multiply_round = [&](Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) {
        load_tokens<MT, RT>(grp[u], at.a_rows, static_cast<long long>(g) << 7);
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


#define LATE(MT, RT, WARPS, UNROLL, PIPELINE, MINB)                                                         \
  extern "C" __global__ void __launch_bounds__(WARPS * 32, MINB)                                           \
      late_mt##MT##_rt##RT##_w##WARPS##_u##UNROLL##_p##PIPELINE##_b##MINB(                                  \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride,                 \
          long long m_rows, long long k) {                                                                 \
    fp8_gemv_late<MT, RT, WARPS, UNROLL, PIPELINE>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s, \
                                              w_s_stride_n, w_s_stride_g, y, y_stride, m_rows, k);         \
  }
LATE(2, 1, 4, 1, 1, 1)
LATE(2, 1, 4, 1, 1, 5)
LATE(2, 1, 4, 1, 1, 6)
LATE(2, 1, 4, 2, 0, 1)
LATE(2, 1, 4, 2, 0, 4)
LATE(2, 1, 4, 2, 0, 5)
LATE(2, 1, 4, 2, 0, 6)
LATE(2, 1, 4, 1, 0, 1)
LATE(2, 1, 4, 1, 0, 5)
LATE(2, 1, 4, 1, 0, 6)
LATE(2, 1, 8, 1, 1, 1)
LATE(2, 1, 8, 1, 1, 3)
LATE(2, 1, 8, 2, 0, 1)
LATE(2, 1, 8, 2, 0, 3)
LATE(2, 1, 8, 1, 0, 1)
LATE(2, 1, 8, 1, 0, 3)
LATE(2, 2, 4, 1, 1, 1)
LATE(2, 2, 8, 1, 0, 1)
LATE(2, 2, 8, 1, 0, 2)

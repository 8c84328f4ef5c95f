#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

// MODE 0: as shipped; 1: no token loads or conversions (constant fragments); 2: tokens
// loaded, not converted (their raw words used as float16 pairs). Diagnostics only.
template <int MT, int RT, int MODE>
__device__ __forceinline__ void multiply_diag(const Group<MT, RT>& grp, float (&acc)[RT][MT][4]) {
  zero(acc);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t b0[MT], b1[MT];
#pragma unroll
    for (int tile = 0; tile < MT; ++tile) {
      if (MODE == 0) {
        b0[tile] = e4m3x2_to_f16x2(grp.a[tile][j]);
        b1[tile] = e4m3x2_to_f16x2(grp.a[tile][j] >> 16);
      } else if (MODE == 1) {
        b0[tile] = 0x3c003c00u + j + tile;
        b1[tile] = 0x3c003c00u + 2 * j + tile;
      } else {
        b0[tile] = grp.a[tile][j] & 0x3fff3fffu;
        b1[tile] = grp.a[tile][(j + 1) & 7] & 0x3fff3fffu;
      }
    }
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const uint32_t a0 = e4m3x2_to_f16x2(grp.w0[rt][j]);
      const uint32_t a1 = e4m3x2_to_f16x2(grp.w1[rt][j]);
      const uint32_t a2 = e4m3x2_to_f16x2(grp.w0[rt][j] >> 16);
      const uint32_t a3 = e4m3x2_to_f16x2(grp.w1[rt][j] >> 16);
#pragma unroll
      for (int tile = 0; tile < MT; ++tile) mma_16816(acc[rt][tile], a0, a1, a2, a3, b0[tile], b1[tile]);
    }
  }
}

template <int MT, int RT, int WARPS, int UNROLL, bool PIPELINE, int MODE>
__device__ __forceinline__ void fp8_gemv_diag(const uint8_t* a_q, long long a_stride,
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
      if (g < groups && MODE != 1) load_tokens<MT, RT>(grp[u], at.a_rows, static_cast<long long>(g) << 7);
    }
  };
  auto multiply_round = [&](const Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) {
        float acc[RT][MT][4];
        multiply_diag<MT, RT, MODE>(grp[u], acc);
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
    if (g < groups && MODE != 1) load_tokens<MT, RT>(cur[u], at.a_rows, static_cast<long long>(g) << 7);
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


#define DIAG(MT, RT, WARPS, UNROLL, PIPELINE, MODE)                                                        \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                 \
      diag_mt##MT##_rt##RT##_w##WARPS##_u##UNROLL##_p##PIPELINE##_m##MODE(                                  \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride,                 \
          long long m_rows, long long k) {                                                                 \
    fp8_gemv_diag<MT, RT, WARPS, UNROLL, PIPELINE, MODE>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s, \
                                              w_s_stride_n, w_s_stride_g, y, y_stride, m_rows, k);         \
  }
DIAG(2, 1, 4, 1, 1, 0)
DIAG(2, 1, 4, 1, 1, 1)
DIAG(2, 1, 4, 1, 1, 2)
DIAG(2, 1, 8, 1, 1, 0)
DIAG(2, 1, 8, 1, 1, 1)
DIAG(2, 1, 8, 1, 1, 2)
DIAG(1, 2, 8, 1, 1, 0)
DIAG(1, 2, 8, 1, 1, 1)
DIAG(1, 2, 8, 1, 1, 2)
DIAG(1, 2, 4, 2, 0, 0)
DIAG(1, 2, 4, 2, 0, 1)
DIAG(1, 2, 4, 2, 0, 2)
DIAG(2, 2, 4, 1, 1, 0)
DIAG(2, 2, 4, 1, 1, 1)
DIAG(2, 2, 4, 1, 1, 2)
DIAG(2, 2, 8, 1, 1, 0)
DIAG(2, 2, 8, 1, 1, 1)
DIAG(2, 2, 8, 1, 1, 2)

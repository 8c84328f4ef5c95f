// The main loop of the decode GEMM kernels (fp8_gemv.cu, fp8_mlp.cu): a block's warps walk
// the K groups of its weight rows round-robin, each group's code products summed exactly
// and scaled into float32 totals, one or two rounds of loads in flight. What differs
// between the kernels is passed in, so that the loop is written once:
//
// - RowPlan: where a thread's rows r and r + 8 of each 16-row mma tile live and which
//   128x128 weight-scale block each takes (fp8_gemv: 16 contiguous rows per tile, one
//   scale block; fp8_mlp's gate/up kernel: 8 gate rows over the 8 matching up rows).
// - Tokens: how the token codes and scales are reached: after griddepcontrol.wait (the
//   kernel before wrote them; AfterPreviousGrid) or per K group, once a flag says the
//   group was written by a kernel still running (fp8_mlp.cu's AfterGroupFlags).
//
// fp8_gemv.cu describes the thread layout; gemv_fragments.cuh holds the per-thread pieces.

#pragma once

#include "gemv_fragments.cuh"

namespace quantroll_gemv {

// A thread's weight rows: tile rt's row r at w_row0 + rt * tile_step (+ the K offset), its
// row r + 8 a further pair_step on; the weight scale of rows r (lo) and r + 8 (hi) of
// K group g at scale_lo / scale_hi + g * scale_stride_g.
struct RowPlan {
  const uint8_t* w_row0;
  long long tile_step, pair_step;
  const float* scale_lo;
  const float* scale_hi;
  long long scale_stride_g;
};

// Tokens written by the kernel before this one on the stream: wait for it once
// (griddepcontrol.wait; at once when this launch was not early), then plain loads.
struct AfterPreviousGrid {
  __device__ __forceinline__ void start() const {
    allow_next_grid();
    wait_for_previous_grid();
  }
  __device__ __forceinline__ void before_group(int) const {}
  __device__ __forceinline__ Words4 tokens(const uint8_t* p) const { return load_cached(p); }
  __device__ __forceinline__ float scale(const float* p) const { return *p; }
};

template <int MT, int RT, bool PINNED>
__device__ __forceinline__ void load_planned_weights(Group<MT, RT>& grp, const RowPlan& plan, long long offset) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const uint8_t* row0 = plan.w_row0 + rt * plan.tile_step + offset;
    const uint8_t* row1 = row0 + plan.pair_step;
    Words4 v;
    v = load_stream<PINNED>(row0);
#pragma unroll
    for (int i = 0; i < 4; ++i) grp.w0[rt][i] = v.w[i];
    v = load_stream<PINNED>(row0 + SECOND_PIECE);
#pragma unroll
    for (int i = 0; i < 4; ++i) grp.w0[rt][4 + i] = v.w[i];
    v = load_stream<PINNED>(row1);
#pragma unroll
    for (int i = 0; i < 4; ++i) grp.w1[rt][i] = v.w[i];
    v = load_stream<PINNED>(row1 + SECOND_PIECE);
#pragma unroll
    for (int i = 0; i < 4; ++i) grp.w1[rt][4 + i] = v.w[i];
  }
}

template <int MT, int RT, class Tokens>
__device__ __forceinline__ void load_planned_tokens(Group<MT, RT>& grp, const Tokens& tokens,
                                                    const uint8_t* const (&a_rows)[MT], long long offset) {
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) {
    Words4 v = tokens.tokens(a_rows[tile] + offset);
#pragma unroll
    for (int i = 0; i < 4; ++i) grp.a[tile][i] = v.w[i];
    v = tokens.tokens(a_rows[tile] + offset + SECOND_PIECE);
#pragma unroll
    for (int i = 0; i < 4; ++i) grp.a[tile][4 + i] = v.w[i];
  }
}

// total += the group's code-product sums times their scales: token row scale x the weight
// scale of rows r (lo) and r + 8 (hi). Each product of scales is formed as fp8_gemv always
// formed it (token scale x weight scale, then times the sum), so one plan's bits are
// another's wherever their rows and scales agree.
template <int MT, int RT, class Tokens>
__device__ __forceinline__ void add_planned(float (&total)[RT][MT][4], const float (&acc)[RT][MT][4],
                                            const Tokens& tokens, const float* a_s, const int (&scale_rows)[MT][2],
                                            long long a_s_stride_m, long long a_s_stride_g, int g, float w_lo,
                                            float w_hi) {
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) {
    const float a0 = tokens.scale(a_s + scale_rows[tile][0] * a_s_stride_m + g * a_s_stride_g);
    const float a1 = tokens.scale(a_s + scale_rows[tile][1] * a_s_stride_m + g * a_s_stride_g);
    const float s0 = a0 * w_lo, s1 = a1 * w_lo, s2 = a0 * w_hi, s3 = a1 * w_hi;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      total[rt][tile][0] += acc[rt][tile][0] * s0;  // weight row r,     token 2t
      total[rt][tile][1] += acc[rt][tile][1] * s1;  // weight row r,     token 2t + 1
      total[rt][tile][2] += acc[rt][tile][2] * s2;  // weight row r + 8, token 2t
      total[rt][tile][3] += acc[rt][tile][3] * s3;  // weight row r + 8, token 2t + 1
    }
  }
}

// The thread's float32 totals over its warp's K groups (group g to warp g % WARPS, UNROLL
// groups per round of loads; PIPELINE: the next round's loads in flight while this one
// multiplies). The first round's weight bytes are requested before tokens.start().
template <int MT, int RT, int WARPS, int UNROLL, bool PIPELINE, class Tokens>
__device__ __forceinline__ void gemv_totals(float (&total)[RT][MT][4], const RowPlan& plan, const Tokens& tokens,
                                            Place<MT>& at, const float* a_s, long long a_s_stride_m,
                                            long long a_s_stride_g) {
  const int warp = at.warp, groups = at.groups;
  zero(total);

  constexpr int STEP = WARPS * UNROLL;
  auto load_round = [&](Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) load_planned_weights<MT, RT, false>(grp[u], plan, static_cast<long long>(g) << 7);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) {
        tokens.before_group(g);
        load_planned_tokens<MT, RT>(grp[u], tokens, at.a_rows, static_cast<long long>(g) << 7);
      }
    }
  };
  auto multiply_round = [&](const Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) {
        float acc[RT][MT][4];
        multiply_group<MT, RT>(grp[u], acc);
        add_planned<MT, RT>(total, acc, tokens, a_s, at.scale_rows, a_s_stride_m, a_s_stride_g, g,
                            plan.scale_lo[g * plan.scale_stride_g], plan.scale_hi[g * plan.scale_stride_g]);
      }
    }
  };

  Group<MT, RT> cur[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int g = warp + u * WARPS;
    if (g < groups) load_planned_weights<MT, RT, true>(cur[u], plan, static_cast<long long>(g) << 7);
  }
  tokens.start();
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) at.a_rows[tile] = after_wait(at.a_rows[tile]);
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int g = warp + u * WARPS;
    if (g < groups) {
      tokens.before_group(g);
      load_planned_tokens<MT, RT>(cur[u], tokens, at.a_rows, static_cast<long long>(g) << 7);
    }
  }

  if (PIPELINE) {
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
}

}  // namespace quantroll_gemv

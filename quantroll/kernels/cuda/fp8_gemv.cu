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

// BF16: the operands are BF16 values (bf16_gemv: a_s and w_s unread, k counts bytes, so
// a "group" is 64 values), else FP8 codes with their scales.
template <int MT, int RT, int WARPS, int UNROLL, bool PIPELINE, bool BF16, bool SECTORS>
__device__ __forceinline__ void fp8_gemv(const uint8_t* a_q, long long a_stride,
                                         const float* a_s, long long a_s_stride_m,
                                         long long a_s_stride_g, const uint8_t* __restrict__ w_q,
                                         long long w_stride, const float* __restrict__ w_s,
                                         long long w_s_stride_n, long long w_s_stride_g,
                                         uint16_t* __restrict__ y, long long y_stride, long long m_rows,
                                         long long k) {
  constexpr int ROWS = 16 * RT;  // weight rows of the block (within one 128-row scale block)
  __shared__ float partial[WARPS][ROWS][partial_row<MT>()];

  Place<MT, SECTORS> at(ROWS, w_q, w_stride, a_q, a_stride, m_rows, k);
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
      if (g < groups) load_weights<MT, RT, false, SECTORS>(grp[u], w_row0, w_stride, static_cast<long long>(g) << 7);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) load_tokens<MT, RT, SECTORS>(grp[u], at.a_rows, static_cast<long long>(g) << 7);
    }
  };
  auto multiply_round = [&](const Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * WARPS;
      if (g < groups) {
        if (BF16) {
          multiply_group_bf16<MT, RT>(grp[u], total);
        } else {
          float acc[RT][MT][4];
          multiply_group<MT, RT>(grp[u], acc);
          add_scaled<MT, RT>(total, acc, a_s, at.scale_rows, a_s_stride_m, a_s_stride_g, g,
                             w_s_block[g * w_s_stride_g]);
        }
      }
    }
  };

  // The first round's weight bytes are requested before waiting for the previous kernel.
  Group<MT, RT> cur[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int g = warp + u * WARPS;
    if (g < groups) load_weights<MT, RT, true, SECTORS>(cur[u], w_row0, w_stride, static_cast<long long>(g) << 7);
  }
  allow_next_grid();
  wait_for_previous_grid();
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) at.a_rows[tile] = after_wait(at.a_rows[tile]);
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int g = warp + u * WARPS;
    if (g < groups) load_tokens<MT, RT, SECTORS>(cur[u], at.a_rows, static_cast<long long>(g) << 7);
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

// The same product with the weight bytes staged through shared memory: each warp keeps
// STAGES of its K groups in flight as asynchronous copies (2 KB each) instead of in
// registers, so the bytes in flight per multiprocessor are bounded by shared memory
// (STAGES x 2 KB per warp) and not by the registers the token codes also need at 16 rows.
// Every thread copies exactly the 64 bytes of its own fragment (rows r and r + 8, 32 bytes
// each) and reads back only those, so no barrier is needed: cp.async.wait_group orders a
// thread's own copies before its reads. The layout [stage][chunk][lane] of 16-byte chunks
// keeps both the copies and the 16-byte reads free of bank conflicts. One 16-row tile per
// block; token codes are loaded one group ahead into registers; the whole-sector layout
// (SECTORS in gemv_fragments.cuh).
template <int MT, int WARPS, int STAGES>
__device__ __forceinline__ void fp8_gemv_staged(const uint8_t* a_q, long long a_stride,
                                                const float* a_s, long long a_s_stride_m,
                                                long long a_s_stride_g, const uint8_t* __restrict__ w_q,
                                                long long w_stride, const float* __restrict__ w_s,
                                                long long w_s_stride_n, long long w_s_stride_g,
                                                uint16_t* __restrict__ y, long long y_stride, long long m_rows,
                                                long long k) {
  static_assert(WARPS * STAGES * 2048 + WARPS * 16 * partial_row<MT>() * 4 <= 48 * 1024, "static shared memory is 48 KB");
  __shared__ uint4 ring[WARPS][STAGES][4][32];
  __shared__ float partial[WARPS][16][partial_row<MT>()];

  Place<MT, true> at(16, w_q, w_stride, a_q, a_stride, m_rows, k);
  const int lane = at.lane, warp = at.warp, groups = at.groups;
  const uint8_t* w_row0 = at.w_row0;
  const uint8_t* w_row1 = w_row0 + 8 * w_stride;
  const float* w_s_block = w_s + (at.n0 >> 7) * w_s_stride_n;
  float total[1][MT][4];
  zero(total);

  // Group g's weight bytes into stage `slot`; always one commit, so that the count of
  // committed groups stays STAGES + (groups consumed) and wait_copies<STAGES - 1> means
  // "the oldest has landed".
  auto stage_weights = [&](int slot, int g) {
    if (g < groups) {
      const long long offset = static_cast<long long>(g) << 7;
      copy_async_16(&ring[warp][slot][0][lane], w_row0 + offset);
      copy_async_16(&ring[warp][slot][1][lane], w_row0 + offset + second_piece<true>());
      copy_async_16(&ring[warp][slot][2][lane], w_row1 + offset);
      copy_async_16(&ring[warp][slot][3][lane], w_row1 + offset + second_piece<true>());
    }
    commit_copies();
  };

  // The first STAGES groups' weight bytes are requested before waiting for the previous kernel.
#pragma unroll
  for (int slot = 0; slot < STAGES; ++slot) stage_weights(slot, warp + slot * WARPS);
  allow_next_grid();
  wait_for_previous_grid();
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) at.a_rows[tile] = after_wait(at.a_rows[tile]);

  Group<MT, 1> cur;
  if (warp < groups) load_tokens<MT, 1, true>(cur, at.a_rows, static_cast<long long>(warp) << 7);
  int slot = 0;
  for (int g = warp; g < groups; g += WARPS) {
    Group<MT, 1> next;  // the token codes of this warp's next group, in flight during the multiply
    if (g + WARPS < groups) load_tokens<MT, 1, true>(next, at.a_rows, static_cast<long long>(g + WARPS) << 7);
    wait_copies<STAGES - 1>();
    const uint4 v0 = ring[warp][slot][0][lane];
    const uint4 v1 = ring[warp][slot][1][lane];
    const uint4 v2 = ring[warp][slot][2][lane];
    const uint4 v3 = ring[warp][slot][3][lane];
    cur.w0[0][0] = v0.x; cur.w0[0][1] = v0.y; cur.w0[0][2] = v0.z; cur.w0[0][3] = v0.w;
    cur.w0[0][4] = v1.x; cur.w0[0][5] = v1.y; cur.w0[0][6] = v1.z; cur.w0[0][7] = v1.w;
    cur.w1[0][0] = v2.x; cur.w1[0][1] = v2.y; cur.w1[0][2] = v2.z; cur.w1[0][3] = v2.w;
    cur.w1[0][4] = v3.x; cur.w1[0][5] = v3.y; cur.w1[0][6] = v3.z; cur.w1[0][7] = v3.w;
    float acc[1][MT][4];
    multiply_group<MT, 1>(cur, acc);
    add_scaled<MT, 1>(total, acc, a_s, at.scale_rows, a_s_stride_m, a_s_stride_g, g, w_s_block[g * w_s_stride_g]);
    stage_weights(slot, g + STAGES * WARPS);  // refill the stage just read (its bytes are in registers)
    slot = slot + 1 == STAGES ? 0 : slot + 1;
    if (g + WARPS < groups) {
#pragma unroll
      for (int tile = 0; tile < MT; ++tile) {
#pragma unroll
        for (int i = 0; i < 8; ++i) cur.a[tile][i] = next.a[tile][i];
      }
    }
  }
  wait_copies<0>();

  reduce_and_store<MT, 1, WARPS>(partial, total, y, y_stride, at.n0, at.last_row);
}

}  // namespace

#define QUANTROLL_FP8_GEMV(MT, RT, WARPS, UNROLL, PIPELINE) QUANTROLL_FP8_GEMV_LAYOUT(MT, RT, WARPS, UNROLL, PIPELINE, false, )
#define QUANTROLL_FP8_GEMV_SECTORS(MT, RT, WARPS, UNROLL, PIPELINE) \
  QUANTROLL_FP8_GEMV_LAYOUT(MT, RT, WARPS, UNROLL, PIPELINE, true, _x)
#define QUANTROLL_FP8_GEMV_LAYOUT(MT, RT, WARPS, UNROLL, PIPELINE, SECTORS, SUFFIX)                         \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                 \
      fp8_gemv_mt##MT##_rt##RT##_w##WARPS##_u##UNROLL##_p##PIPELINE##SUFFIX(                               \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride,                 \
          long long m_rows, long long k) {                                                                 \
    fp8_gemv<MT, RT, WARPS, UNROLL, PIPELINE, false, SECTORS>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s,    \
                                    w_s_stride_n, w_s_stride_g, y, y_stride, m_rows, k);                   \
  }

#define QUANTROLL_FP8_GEMV_STAGED(MT, WARPS, STAGES)                                                      \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                 \
      fp8_gemv_staged_mt##MT##_w##WARPS##_s##STAGES(                                                        \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride,                 \
          long long m_rows, long long k) {                                                                 \
    fp8_gemv_staged<MT, WARPS, STAGES>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s, \
                                       w_s_stride_n, w_s_stride_g, y, y_stride, m_rows, k);                \
  }

// The BF16 decode GEMM (bf16_gemv in fp8_gemv.py): y = x @ w^T on BF16 values, float32 sums;
// strides and k in bytes.
#define QUANTROLL_BF16_GEMV(MT, RT, WARPS, UNROLL, PIPELINE)                                               \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                 \
      bf16_gemv_mt##MT##_rt##RT##_w##WARPS##_u##UNROLL##_p##PIPELINE(                                      \
          const uint8_t* x, long long x_stride, const uint8_t* w, long long w_stride, uint16_t* y,         \
          long long y_stride, long long m_rows, long long k_bytes) {                                       \
    fp8_gemv<MT, RT, WARPS, UNROLL, PIPELINE, true, true>(x, x_stride, nullptr, 0, 0, w, w_stride, nullptr, 0,  \
                                                     0, y, y_stride, m_rows, k_bytes);                     \
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
// Staged through shared memory (prepared 2026-12-01, not yet run on a GPU).
QUANTROLL_FP8_GEMV_STAGED(1, 4, 4)
QUANTROLL_FP8_GEMV_STAGED(1, 4, 5)
QUANTROLL_FP8_GEMV_STAGED(1, 8, 2)
QUANTROLL_FP8_GEMV_STAGED(1, 2, 8)
QUANTROLL_FP8_GEMV_STAGED(2, 4, 4)
QUANTROLL_FP8_GEMV_STAGED(2, 4, 5)
QUANTROLL_FP8_GEMV_STAGED(2, 8, 2)
QUANTROLL_FP8_GEMV_STAGED(2, 2, 8)
// The whole-sector layout (prepared 2026-12-01, not yet run on a GPU): the chosen variants.
QUANTROLL_FP8_GEMV_SECTORS(1, 1, 8, 1, 1)
QUANTROLL_FP8_GEMV_SECTORS(1, 2, 8, 1, 1)
QUANTROLL_FP8_GEMV_SECTORS(2, 1, 8, 1, 1)
QUANTROLL_FP8_GEMV_SECTORS(2, 1, 4, 1, 1)
QUANTROLL_FP8_GEMV_SECTORS(2, 1, 4, 2, 0)
// BF16, whole-sector layout (prepared 2026-12-01, not yet run on a GPU).
QUANTROLL_BF16_GEMV(1, 1, 8, 1, 1)
QUANTROLL_BF16_GEMV(1, 2, 8, 1, 1)
QUANTROLL_BF16_GEMV(1, 1, 4, 2, 0)
QUANTROLL_BF16_GEMV(2, 1, 8, 1, 1)
QUANTROLL_BF16_GEMV(2, 1, 4, 1, 1)
QUANTROLL_BF16_GEMV(2, 1, 4, 2, 0)

// The block-FP8 decode GEMM of fp8_gemv.cu with the token codes shared by a block's row
// groups: y = (a_q * a_s) @ (w_q * w_s)^T, 1x128 activation scales, 128x128 weight scales,
// BF16 out, float32-accurate (exact float16 products, float32 sums), the same result every run.
//
// Why: at 16 token rows fp8_gemv.cu's cost follows the token bytes each warp loads (a
// block's warps take different K groups of the same 16 or 32 weight rows, so the block
// reads as many token bytes as weight bytes at 16 rows; float16 tokens made it up to 1.6x
// slower, two weight tiles per warp beat one: docs/PERFORMANCE.md, session 9). Here a
// block's warps form RW row groups x KW K slices: warp (rw, kw) multiplies its RT weight
// tiles (rows 16 RT rw ..) by K groups kw, kw + KW, ... . With STAGED the block first copies
// all its token rows' codes (every K group) into shared memory once (cp.async, one barrier),
// and each warp reads its fragments there just before it multiplies them; without, warps
// load them as fp8_gemv.cu does and the RW warps of a K slice meet in L1. Either way a
// block reads the tokens once for 16 RT RW weight rows instead of 16 RT.
//
// (Session 9 prepared a variant that copied the tokens round by round with one barrier per
// round and one K group of weights in flight per warp: about 2x slower than fp8_gemv.cu at
// 1 and 16 rows, measured 2026-12-01, session 10; here weights stream per warp as in
// fp8_gemv.cu, UNROLL groups per round and PIPELINE, with no barrier in the loop.)
//
// Per warp the arithmetic is fp8_gemv.cu's: the same fragments, exact products and float32
// sums per group, scaled and added in group order; the K slices' sums are added in slice
// order at the end. So it equals fp8_gemv_mt<MT>_rt<RT>_w<KW>_* bit for bit (tests compare).
// Launch: each warp requests its first round of weight bytes before waiting for the
// previous kernel (programmatic dependent launch), the token codes after.

#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
}

// Bytes between two token rows in shared memory: K plus 16, so that the 8 rows of a
// fragment load start in different banks.
__host__ __device__ __forceinline__ long long staged_row(long long k) { return k + 16; }

template <int MT, int RT, int RW, int KW, int UNROLL, bool PIPELINE, bool STAGED>
__device__ __forceinline__ void fp8_gemv_shared(const uint8_t* a_q, long long a_stride, const float* a_s,
                                                long long a_s_stride_m, long long a_s_stride_g,
                                                const uint8_t* __restrict__ w_q, long long w_stride,
                                                const float* __restrict__ w_s, long long w_s_stride_n,
                                                long long w_s_stride_g, uint16_t* __restrict__ y, long long y_stride,
                                                long long m_rows, long long k) {
  constexpr int THREADS = 32 * RW * KW;
  constexpr int WARP_ROWS = 16 * RT;
  constexpr int ROWS = WARP_ROWS * RW;
  extern __shared__ __align__(16) uint8_t staged[];  // STAGED: [token rows][staged_row(k)]
  __shared__ float partial[KW][ROWS][partial_row<MT>()];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rw = warp / KW, kw = warp % KW;
  const int r = lane >> 2, t = lane & 3;
  const long long n0 = static_cast<long long>(blockIdx.x) * ROWS;
  const int groups = static_cast<int>(k >> 7);
  const int last_row = static_cast<int>(m_rows) - 1;
  const uint8_t* w_row0 = w_q + (n0 + WARP_ROWS * rw + r) * w_stride + lane_offset(t);
  const float* w_s_block = w_s + (n0 >> 7) * w_s_stride_n;
  const long long srow = staged_row(k);
  int scale_rows[MT][2];
  const uint8_t* a_rows[MT];  // STAGED: offsets into `staged`; else global token rows
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) {
    const int row = min(r + 8 * tile, last_row);
    a_rows[tile] = STAGED ? staged + row * srow + lane_offset(t) : a_q + row * a_stride + lane_offset(t);
    scale_rows[tile][0] = min(2 * t + 8 * tile, last_row);
    scale_rows[tile][1] = min(2 * t + 1 + 8 * tile, last_row);
  }
  float total[RT][MT][4];
  zero(total);

  auto staged_tokens = [&](Group<MT, RT>& grp, int g) {
#pragma unroll
    for (int tile = 0; tile < MT; ++tile) {
      const uint4 v0 = *reinterpret_cast<const uint4*>(a_rows[tile] + (g << 7));
      const uint4 v1 = *reinterpret_cast<const uint4*>(a_rows[tile] + (g << 7) + SECOND_PIECE);
      grp.a[tile][0] = v0.x; grp.a[tile][1] = v0.y; grp.a[tile][2] = v0.z; grp.a[tile][3] = v0.w;
      grp.a[tile][4] = v1.x; grp.a[tile][5] = v1.y; grp.a[tile][6] = v1.z; grp.a[tile][7] = v1.w;
    }
  };
  // One round: UNROLL groups (first, first + KW, ...) of this warp's K slice.
  constexpr int STEP = KW * UNROLL;
  auto load_round = [&](Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * KW;
      if (g < groups) load_weights<MT, RT, false>(grp[u], w_row0, w_stride, static_cast<long long>(g) << 7);
    }
    if (!STAGED) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int g = first + u * KW;
        if (g < groups) load_tokens<MT, RT>(grp[u], a_rows, static_cast<long long>(g) << 7);
      }
    }
  };
  auto multiply_round = [&](Group<MT, RT> (&grp)[UNROLL], int first) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = first + u * KW;
      if (g < groups) {
        if (STAGED) staged_tokens(grp[u], g);
        float acc[RT][MT][4];
        multiply_group<MT, RT>(grp[u], acc);
        add_scaled<MT, RT>(total, acc, a_s, scale_rows, a_s_stride_m, a_s_stride_g, g,
                           w_s_block[g * w_s_stride_g]);
      }
    }
  };

  // The first round's weight bytes are requested before waiting for the previous kernel.
  Group<MT, RT> cur[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int g = kw + u * KW;
    if (g < groups) load_weights<MT, RT, true>(cur[u], w_row0, w_stride, static_cast<long long>(g) << 7);
  }
  allow_next_grid();
  wait_for_previous_grid();
  if (STAGED) {
    // Every token row of the batch, all of K, once per block; rows past the batch are not
    // copied (fragments read the last row instead).
    const uint8_t* src = after_wait(a_q);
    const int token_rows = min(static_cast<int>(m_rows), 8 * MT);
    const int pieces = static_cast<int>(k >> 4);
    for (int row = 0; row < token_rows; ++row) {
      for (int p = threadIdx.x; p < pieces; p += THREADS)
        copy_async_16(staged + row * srow + 16 * p, src + row * a_stride + 16 * p);
    }
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
    __syncthreads();
  } else {
#pragma unroll
    for (int tile = 0; tile < MT; ++tile) a_rows[tile] = after_wait(a_rows[tile]);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int g = kw + u * KW;
      if (g < groups) load_tokens<MT, RT>(cur[u], a_rows, static_cast<long long>(g) << 7);
    }
  }

  if (PIPELINE) {
    // Two register buffers: the next round's loads are in flight while this one multiplies.
    Group<MT, RT> nxt[UNROLL];
    for (int first = kw; first < groups; first += 2 * STEP) {
      if (first + STEP < groups) load_round(nxt, first + STEP);
      multiply_round(cur, first);
      if (first + STEP >= groups) break;
      if (first + 2 * STEP < groups) load_round(cur, first + 2 * STEP);
      multiply_round(nxt, first + STEP);
    }
  } else {
    for (int first = kw; first < groups; first += STEP) {
      if (first != kw) load_round(cur, first);
      multiply_round(cur, first);
    }
  }

  // The K slices' sums added in slice order; BF16 out for the rows that exist.
  write_partial<MT, RT, ROWS>(partial[kw], WARP_ROWS * rw, total);
  __syncthreads();
  sum_partials_and_store<MT, ROWS, KW, THREADS>(partial, y, y_stride, n0, last_row);
}

}  // namespace

#define QUANTROLL_FP8_GEMV_SHARED(MT, RT, RW, KW, UNROLL, PIPELINE, STAGED)                                   \
  extern "C" __global__ void __launch_bounds__(32 * RW * KW)                                                  \
      fp8_gemv_shared_mt##MT##_rt##RT##_r##RW##_k##KW##_u##UNROLL##_p##PIPELINE##_s##STAGED(                  \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                   \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                   \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride,                    \
          long long m_rows, long long k) {                                                                    \
    fp8_gemv_shared<MT, RT, RW, KW, UNROLL, PIPELINE, STAGED>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, \
                                                              w_q, w_stride, w_s, w_s_stride_n, w_s_stride_g, \
                                                              y, y_stride, m_rows, k);                        \
  }

// (token tiles, row tiles per warp, row groups, K slices, unroll, pipeline, staged):
// fp8_gemv_shared.py's VARIANTS
QUANTROLL_FP8_GEMV_SHARED(2, 1, 4, 1, 2, 1, 1)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 8, 1, 2, 1, 1)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 2, 1, 2, 1, 1)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 4, 1, 4, 0, 1)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 4, 2, 1, 1, 1)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 2, 4, 1, 1, 1)
QUANTROLL_FP8_GEMV_SHARED(2, 2, 2, 1, 1, 1, 1)
QUANTROLL_FP8_GEMV_SHARED(2, 2, 4, 1, 1, 1, 1)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 4, 1, 2, 1, 0)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 2, 4, 1, 1, 0)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 4, 2, 1, 1, 0)
QUANTROLL_FP8_GEMV_SHARED(2, 1, 8, 1, 1, 1, 0)
QUANTROLL_FP8_GEMV_SHARED(1, 2, 4, 1, 2, 1, 1)
QUANTROLL_FP8_GEMV_SHARED(1, 2, 2, 2, 2, 0, 0)

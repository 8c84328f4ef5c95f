// The block-FP8 decode GEMM of fp8_gemv.cu with the token codes loaded once per block:
// y = (a_q * a_s) @ (w_q * w_s)^T, 1x128 activation scales, 128x128 weight scales, BF16
// out, float32-accurate (exact float16 products, float32 sums), the same result every run.
//
// Why: at 16 token rows fp8_gemv.cu's cost follows the token bytes each warp loads (its
// warps take different K groups, so every warp loads the tokens of its own groups, as many
// bytes as weights at 16 rows): float16 tokens (twice the bytes) made it up to 1.6x slower,
// and two weight tiles per warp (half the token bytes per weight byte) beat their one-tile
// twin, but cost registers (docs/PERFORMANCE.md, session 9). Here a block's warps form RW
// row groups x KW K slices: warp (rw, kw) multiplies weight rows 16 rw .. 16 rw + 15 of the
// block by K groups kw, kw + KW, ...; each round of KW K groups, the block copies those
// groups' token codes once into shared memory (cp.async, 16 bytes per thread and chunk),
// and the RW warps of a K slice read their B fragments from there. Token rows past the
// batch are not copied; fragments read the last row instead (as fp8_gemv.cu does).
//
// Per warp the arithmetic is fp8_gemv.cu's for one row tile: the same fragments, the same
// exact products and float32 sums per group, scaled and added in group order; the K slices'
// sums are added in slice order at the end. So it equals fp8_gemv_mt<MT>_rt1_w<KW>_* bit for
// bit (tests compare).
//
// Pipeline: STAGES rounds of tokens in flight in shared memory (one barrier per round),
// the next round's weights in flight in registers (as PIPELINE in fp8_gemv.cu). Launch:
// the first round's weight bytes are requested before waiting for the previous kernel
// (programmatic dependent launch), the token copies after.

#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <int MT, int KW>
struct TokenRound {  // one round's token codes: KW groups x 8 MT rows x 128 bytes (+16 padding)
  static constexpr int ROW = 128 + 16;
  static constexpr int GROUP = 8 * MT * ROW;
  static constexpr int BYTES = KW * GROUP;
};

template <int MT, int RW, int KW, int STAGES>
__device__ __forceinline__ void fp8_gemv_shared(const uint8_t* a_q, long long a_stride, const float* a_s,
                                                long long a_s_stride_m, long long a_s_stride_g,
                                                const uint8_t* __restrict__ w_q, long long w_stride,
                                                const float* __restrict__ w_s, long long w_s_stride_n,
                                                long long w_s_stride_g, uint16_t* __restrict__ y, long long y_stride,
                                                long long m_rows, long long k) {
  using R = TokenRound<MT, KW>;
  constexpr int THREADS = 32 * RW * KW;
  constexpr int ROWS = 16 * RW;
  __shared__ __align__(16) uint8_t tokens[STAGES][R::BYTES];
  __shared__ float partial[KW][ROWS][partial_row<MT>()];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rw = warp / KW, kw = warp % KW;
  const int r = lane >> 2, t = lane & 3;
  const long long n0 = static_cast<long long>(blockIdx.x) * ROWS;
  const int groups = static_cast<int>(k >> 7);
  const int rounds = (groups + KW - 1) / KW;
  const int last_row = static_cast<int>(m_rows) - 1;
  const int token_rows = min(static_cast<int>(m_rows), 8 * MT);
  const uint8_t* w_row0 = w_q + (n0 + 16 * rw + r) * w_stride + lane_offset(t);
  const float* w_s_block = w_s + (n0 >> 7) * w_s_stride_n;
  int rows[MT], scale_rows[MT][2];
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) {
    rows[tile] = min(r + 8 * tile, last_row);
    scale_rows[tile][0] = min(2 * t + 8 * tile, last_row);
    scale_rows[tile][1] = min(2 * t + 1 + 8 * tile, last_row);
  }

  // Round q's token codes into its slot: chunk c = (group j, row, 16-byte piece).
  auto copy_round = [&](int q) {
    if (q < rounds) {
      uint8_t* slot = tokens[q % STAGES];
      const int chunks = KW * token_rows * 8;
      for (int c = threadIdx.x; c < chunks; c += THREADS) {
        const int j = c / (token_rows * 8), row = (c / 8) % token_rows, piece = c % 8;
        const int g = q * KW + j;
        if (g < groups)
          copy_async_16(slot + j * R::GROUP + row * R::ROW + piece * 16,
                        a_q + row * a_stride + (static_cast<long long>(g) << 7) + piece * 16);
      }
    }
    commit_copies();  // always one group per round, so wait_copies<STAGES - 2> means "round q landed"
  };

  float total[1][MT][4];
  zero(total);
  Group<MT, 1> cur, nxt;
  if (kw < groups) load_weights<MT, 1, true>(cur, w_row0, w_stride, static_cast<long long>(kw) << 7);
  allow_next_grid();
  wait_for_previous_grid();
  a_q = after_wait(a_q);  // the token copies' addresses, only now (copy_round reads a_q)
#pragma unroll
  for (int q = 0; q < STAGES - 1; ++q) copy_round(q);

  for (int q = 0; q < rounds; ++q) {
    const int g = q * KW + kw;
    wait_copies<STAGES - 2>();  // this thread's copies of round q have landed
    __syncthreads();            // everyone's, and every warp is done with round q - 1's slot
    copy_round(q + STAGES - 1);  // into that slot
    if (g + KW < groups) load_weights<MT, 1, false>(nxt, w_row0, w_stride, static_cast<long long>(g + KW) << 7);
    if (g < groups) {
      const uint8_t* slot = tokens[q % STAGES] + kw * R::GROUP + lane_offset(t);
#pragma unroll
      for (int tile = 0; tile < MT; ++tile) {
        const uint4 v0 = *reinterpret_cast<const uint4*>(slot + rows[tile] * R::ROW);
        const uint4 v1 = *reinterpret_cast<const uint4*>(slot + rows[tile] * R::ROW + SECOND_PIECE);
        cur.a[tile][0] = v0.x; cur.a[tile][1] = v0.y; cur.a[tile][2] = v0.z; cur.a[tile][3] = v0.w;
        cur.a[tile][4] = v1.x; cur.a[tile][5] = v1.y; cur.a[tile][6] = v1.z; cur.a[tile][7] = v1.w;
      }
      float acc[1][MT][4];
      multiply_group<MT, 1>(cur, acc);
      add_scaled<MT, 1>(total, acc, a_s, scale_rows, a_s_stride_m, a_s_stride_g, g, w_s_block[g * w_s_stride_g]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      cur.w0[0][i] = nxt.w0[0][i];
      cur.w1[0][i] = nxt.w1[0][i];
    }
  }
  wait_copies<0>();

  // The K slices' sums added in slice order; BF16 out for the rows that exist.
  write_partial<MT, 1, ROWS>(partial[kw], 16 * rw, total);
  __syncthreads();
  sum_partials_and_store<MT, ROWS, KW, THREADS>(partial, y, y_stride, n0, last_row);
}

}  // namespace

#define QUANTROLL_FP8_GEMV_SHARED(MT, RW, KW, STAGES)                                                          \
  extern "C" __global__ void __launch_bounds__(32 * RW * KW)                                                    \
      fp8_gemv_shared_mt##MT##_r##RW##_k##KW##_s##STAGES(                                                       \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                     \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                     \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride,                      \
          long long m_rows, long long k) {                                                                      \
    fp8_gemv_shared<MT, RW, KW, STAGES>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s,   \
                                        w_s_stride_n, w_s_stride_g, y, y_stride, m_rows, k);                  \
  }

// (token tiles, row groups, K slices, stages): fp8_gemv_shared.py's VARIANTS
QUANTROLL_FP8_GEMV_SHARED(2, 2, 4, 3)
QUANTROLL_FP8_GEMV_SHARED(2, 4, 2, 3)
QUANTROLL_FP8_GEMV_SHARED(2, 2, 2, 3)
QUANTROLL_FP8_GEMV_SHARED(2, 4, 4, 3)
QUANTROLL_FP8_GEMV_SHARED(2, 8, 1, 3)
QUANTROLL_FP8_GEMV_SHARED(2, 4, 2, 4)
QUANTROLL_FP8_GEMV_SHARED(1, 2, 4, 3)
QUANTROLL_FP8_GEMV_SHARED(1, 4, 2, 3)

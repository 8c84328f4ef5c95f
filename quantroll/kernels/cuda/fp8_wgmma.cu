// Block-FP8 decode GEMM for 17-64 token rows on Hopper's warpgroup MMA (sm_90a only):
// y = (a_q * a_s) @ (w_q * w_s)^T, 1x128 activation scales, 128x128 weight scales, BF16
// output, float32-accurate. Off (fp8_wgmma.py): a first version (one K group in flight,
// tokens widened after the MMAs) was correct on the H200 but slower than the Triton kernel
// (2026-12-01); this one (1-3 groups in flight, tokens widened during the MMAs) has not
// run on a GPU yet (tests/kernels/test_fp8_wgmma.py, bench/wgmma_decode.py).
//
// Why: at 64 rows the mma.sync kernels (Triton's and fp8_gemv.cu's) are bound by mma.sync
// throughput (~290 TFLOP/s on gate_up), twice the time of the weight bytes; the FP8
// warpgroup MMA is fast but its narrower accumulation fails issue 3's logits criterion.
// Here the e4m3 codes are widened to float16 (exact) and multiplied on the float16
// warpgroup MMA, whose products are exact and sums float32, as in the mma.sync path.
//
// Layout: a block of WG warpgroups owns 64 * WG weight rows and the K groups of one split;
// every warpgroup multiplies its 64 rows (A, from registers: each thread loads its weight
// bytes with 16-byte loads straight into the fragment registers, as fp8_gemv.cu does, and
// widens them with cvt) by the same 64 token columns (B, float16 in shared memory, widened
// once per block and K group). Per 128-wide K group: 8 wgmma.m64n64k16 into a zeroed
// accumulator, then total += acc * a_s[token, g] * w_s[row block, g] in float32 (the block
// scales change every group). Token columns past M are zeros. Splits > 1 write float32
// partials that fp8_wgmma_reduce adds in split order (deterministic, no atomics).
//
// The K order inside a group is free (a dot product does not care), and A's registers
// carry fp8_gemv.cu's order: thread (r, t) of warp w holds rows 16 w + r and + 8, bytes
// 32 t .. 32 t + 31 of the group; MMA step j takes word j, its low half as k slots
// (2t, 2t + 1) and its high half as (2t + 8, 2t + 9). B's shared-memory copy of the tokens
// follows the same map: step j, slot 2t + e <- byte 32 t + 4 j + e, slot 2t + 8 + e <- byte
// 32 t + 4 j + 2 + e.
//
// B in shared memory, per K group and MMA step j (2 KB): K-major, no swizzle, 8x8 core
// matrices of float16 (8 token rows of 16 bytes); core (token block nb, k block kb) at
// j * 2048 + nb * 256 + kb * 128. Descriptor: leading byte offset (between K-adjacent
// cores) 128, stride byte offset (between N-adjacent cores) 256.

#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

constexpr int TOKENS = 64;                 // token columns of the tile (M <= 64)
constexpr int STEP_BYTES = TOKENS * 16 * 2;  // one k16 slice of B in float16
constexpr int GROUP_BYTES = 8 * STEP_BYTES;  // a 128-wide K group of B: 16 KB

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// wgmma shared-memory matrix descriptor: start address, leading and stride byte offsets
// (all >> 4), base offset 0, no swizzle.
__device__ __forceinline__ uint64_t b_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address >> 4) & 0x3FFF) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Registers that the next wgmma reads (A fragments, the accumulator) defined here, before
// wgmma_fence: an empty volatile asm that "modifies" them keeps the compiler from sinking
// their producers below the fence (the pattern of CUTLASS's warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Shared-memory writes of ordinary stores made visible to the warpgroup MMA (async proxy).
__device__ __forceinline__ void fence_shared_for_mma() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// d = A B (accumulate = 0) or d += A B: A 64x16 float16 from registers, B 16x64 float16
// from shared memory (descriptor), float32 accumulator of 32 registers per thread.
__device__ __forceinline__ void wgmma_64x64x16(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(accumulate));
}

// The block's share of one K group's tokens, widened into B's layout: 512 units (token n,
// half h, chunk t) of 16 code bytes (bytes 32 t + 16 h .. + 15 of the group); unit words
// q = 0..3 are MMA steps j = 4 h + q, their low halves k block 0, high halves k block 1,
// both at element pair t of token row n. Tokens past the batch are zeros. Also the
// group's token scales (zero past the batch).
template <int THREADS>
struct TokenStage {
  static constexpr int UNITS = 512 / THREADS;
  uint32_t words[UNITS][4];
  float scale;

  __device__ __forceinline__ void load(const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,
                                       long long a_s_stride_g, int g, int m_rows) {
#pragma unroll
    for (int i = 0; i < UNITS; ++i) {
      const int u = threadIdx.x + i * THREADS;
      const int n = u >> 3, h = (u >> 2) & 1, t = u & 3;
      if (n < m_rows) {
        const Words4 v = load_cached(a_q + n * a_stride + (static_cast<long long>(g) << 7) + 32 * t + 16 * h);
#pragma unroll
        for (int q = 0; q < 4; ++q) words[i][q] = v.w[q];
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) words[i][q] = 0u;
      }
    }
    scale = threadIdx.x < TOKENS && threadIdx.x < m_rows ? a_s[threadIdx.x * a_s_stride_m + g * a_s_stride_g] : 0.0f;
  }

  __device__ __forceinline__ void store(uint8_t* b, float* scales) const {
#pragma unroll
    for (int i = 0; i < UNITS; ++i) {
      const int u = threadIdx.x + i * THREADS;
      const int n = u >> 3, h = (u >> 2) & 1, t = u & 3;
      uint8_t* row = b + (n >> 3) * 256 + (n & 7) * 16 + 4 * t;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = 4 * h + q;
        *reinterpret_cast<uint32_t*>(row + j * STEP_BYTES) = e4m3x2_to_f16x2(words[i][q]);            // k block 0
        *reinterpret_cast<uint32_t*>(row + j * STEP_BYTES + 128) = e4m3x2_to_f16x2(words[i][q] >> 16);  // k block 1
      }
    }
    if (threadIdx.x < TOKENS) scales[threadIdx.x] = scale;
  }
};

template <int WG, int DEPTH>
__device__ __forceinline__ void fp8_wgmma(const uint8_t* a_q, long long a_stride, const float* a_s,
                                          long long a_s_stride_m, long long a_s_stride_g,
                                          const uint8_t* __restrict__ w_q, long long w_stride,
                                          const float* __restrict__ w_s, long long w_s_stride_n,
                                          long long w_s_stride_g, uint16_t* __restrict__ y, long long y_stride,
                                          float* __restrict__ partial, long long m_rows_ll, long long k,
                                          long long groups_per_split) {
  constexpr int THREADS = 128 * WG;
  __shared__ __align__(1024) uint8_t b_tiles[2][GROUP_BYTES];
  __shared__ float token_scales[2][TOKENS];

  const int m_rows = static_cast<int>(m_rows_ll);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;  // warp w: rows 16 (w % 4) of warpgroup w / 4
  const int r = lane >> 2, t = lane & 3;
  const long long n0 = static_cast<long long>(blockIdx.x) * (64 * WG);
  const long long row = n0 + 16 * warp + r;  // and row + 8
  const uint8_t* w_row0 = w_q + row * w_stride + lane_offset(t);
  const float* w_s_block = w_s + (n0 >> 7) * w_s_stride_n;
  const int groups = static_cast<int>(k >> 7);
  const int g0 = static_cast<int>(blockIdx.y * groups_per_split);
  const int g1 = min(groups, g0 + static_cast<int>(groups_per_split));

  float total[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) total[i] = 0.0f;

  // DEPTH groups of weights (registers) and of tokens (registers, until they go to shared
  // memory the group before their MMAs) in flight; the weights are requested before
  // waiting for the previous kernel. Ring slot d holds groups g0 + d, g0 + d + DEPTH, ...
  Group<1, 1> w[DEPTH];
  TokenStage<THREADS> tok[DEPTH];
#pragma unroll
  for (int d = 0; d < DEPTH; ++d) {
    if (g0 + d < g1) load_weights<1, 1, true>(w[d], w_row0, w_stride, static_cast<long long>(g0 + d) << 7);
  }
  allow_next_grid();
  wait_for_previous_grid();
  const uint8_t* tokens = after_wait(a_q);
#pragma unroll
  for (int d = 0; d < DEPTH; ++d) {
    if (g0 + d < g1) tok[d].load(tokens, a_stride, a_s, a_s_stride_m, a_s_stride_g, g0 + d, m_rows);
  }
  if (g0 < g1) {
    tok[0].store(b_tiles[0], token_scales[0]);
    if (g0 + DEPTH < g1) tok[0].load(tokens, a_stride, a_s, a_s_stride_m, a_s_stride_g, g0 + DEPTH, m_rows);
  }
  fence_shared_for_mma();
  __syncthreads();

  for (int base = g0; base < g1; base += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const int g = base + d;
      if (g >= g1) break;
      const int buf = (g - g0) & 1;
      // A fragments of the 8 steps (written before the fence that orders them for the MMA)
      uint32_t a[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        a[j][0] = e4m3x2_to_f16x2(w[d].w0[0][j]);        // row r,     slots 2t, 2t + 1
        a[j][1] = e4m3x2_to_f16x2(w[d].w1[0][j]);        // row r + 8, slots 2t, 2t + 1
        a[j][2] = e4m3x2_to_f16x2(w[d].w0[0][j] >> 16);  // row r,     slots 2t + 8, 2t + 9
        a[j][3] = e4m3x2_to_f16x2(w[d].w1[0][j] >> 16);  // row r + 8, slots 2t + 8, 2t + 9
      }
      if (g + DEPTH < g1) load_weights<1, 1, false>(w[d], w_row0, w_stride, static_cast<long long>(g + DEPTH) << 7);
      float acc[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) pin(a[j]);
      pin(acc);
      wgmma_fence();
      const uint32_t b_base = shared_address(b_tiles[buf]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        wgmma_64x64x16(acc, a[j][0], a[j][1], a[j][2], a[j][3], b_descriptor(b_base + j * STEP_BYTES), j);
      }
      wgmma_commit();
      if (g + 1 < g1) {
        // while the MMAs run: group g + 1's tokens (ring slot d + 1) into the other buffer,
        // last read by group g - 1's MMAs, which every thread waited for before the
        // previous barrier; the slot then takes group g + 1 + DEPTH
        const int NEXT = (d + 1) % DEPTH;  // static after unrolling
        tok[NEXT].store(b_tiles[buf ^ 1], token_scales[buf ^ 1]);
        if (g + 1 + DEPTH < g1) {
          tok[NEXT].load(tokens, a_stride, a_s, a_s_stride_m, a_s_stride_g, g + 1 + DEPTH, m_rows);
        }
      }
      wgmma_wait_all();
      // acc[4 c + e]: row r (e < 2) or r + 8, token column 8 c + 2 t + (e & 1)
      const float w_scale = w_s_block[g * w_s_stride_g];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const float s0 = token_scales[buf][8 * c + 2 * t] * w_scale;
        const float s1 = token_scales[buf][8 * c + 2 * t + 1] * w_scale;
        total[4 * c + 0] += acc[4 * c + 0] * s0;
        total[4 * c + 1] += acc[4 * c + 1] * s1;
        total[4 * c + 2] += acc[4 * c + 2] * s0;
        total[4 * c + 3] += acc[4 * c + 3] * s1;
      }
      // Note (not measured): fence.proxy.async compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S;
      // if the MEMBAR drains this thread's loads still in flight, groups in flight beyond
      // one buy nothing, and the tokens would have to reach shared memory through the async
      // proxy (e.g. producers writing float16 codes in B's layout, bulk-copied) instead.
      fence_shared_for_mma();
      __syncthreads();
    }
  }

  // Out: BF16 (one split) or this split's float32 partial, token columns that exist.
#pragma unroll
  for (int c = 0; c < 8; ++c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 8 * c + 2 * t + (e & 1);
      const long long n = row + (e >> 1) * 8;
      if (m < m_rows) {
        if (gridDim.y == 1) {
          y[m * y_stride + n] = f32_to_bf16_rne(total[4 * c + e]);
        } else {
          partial[(static_cast<long long>(blockIdx.y) * m_rows + m) * (gridDim.x * 64 * WG) + n] = total[4 * c + e];
        }
      }
    }
  }
}

}  // namespace

#define QUANTROLL_FP8_WGMMA(WG, DEPTH)                                                                      \
  extern "C" __global__ void __launch_bounds__(128 * WG) fp8_wgmma_wg##WG##_d##DEPTH(                       \
      const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m, long long a_s_stride_g, \
      const uint8_t* w_q, long long w_stride, const float* w_s, long long w_s_stride_n, long long w_s_stride_g, \
      uint16_t* y, long long y_stride, float* partial, long long m_rows, long long k, long long groups_per_split) { \
    fp8_wgmma<WG, DEPTH>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s, w_s_stride_n,   \
                         w_s_stride_g, y, y_stride, partial, m_rows, k, groups_per_split);                   \
  }

// (warpgroups, groups in flight): the variants fp8_wgmma.py's VARIANTS names
QUANTROLL_FP8_WGMMA(1, 1)
QUANTROLL_FP8_WGMMA(1, 2)
QUANTROLL_FP8_WGMMA(1, 3)
QUANTROLL_FP8_WGMMA(2, 2)

// The splits' float32 partials [splits, M, N] added in split order, BF16 (round to nearest
// even) out: one thread per output.
extern "C" __global__ void __launch_bounds__(256) fp8_wgmma_reduce(const float* partial, long long splits,
                                                                   long long m_rows, long long n_cols,
                                                                   uint16_t* y, long long y_stride) {
  const long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= m_rows * n_cols) return;
  const long long m = i / n_cols, n = i % n_cols;
  float sum = 0.0f;
  for (long long s = 0; s < splits; ++s) sum += partial[(s * m_rows + m) * n_cols + n];
  y[m * y_stride + n] = quantroll_gemv::f32_to_bf16_rne(sum);
}

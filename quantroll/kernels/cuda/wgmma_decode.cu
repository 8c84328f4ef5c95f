// Block-FP8 decode GEMM for 17-64 token rows on Hopper's warpgroup MMA (sm_90a only):
// y = (a_q * a_s) @ (w_q * w_s)^T, 1x128 activation scales, 128x128 weight scales, BF16
// output, float32-accurate.
//
// Why: at 64 rows the mma.sync kernels are bound by mma.sync throughput (~290 TFLOP/s on
// gate_up, twice the time of the weight bytes); the FP8 warpgroup MMA is fast but its
// narrower accumulation fails issue 3's logits criterion. Here the e4m3 codes are widened
// to float16 (exact) and multiplied on the float16 warpgroup MMA: exact products, float32
// sums, as in the mma.sync path.
//
// What a first version (register-direct weight loads, one K group in flight per thread)
// taught: it streamed gate_up at ~2 TB/s, bound by the bytes it could keep in flight. Here
// a producer warp streams the weight rows through shared memory with bulk asynchronous
// copies (STAGES stages of GPS K groups, mbarrier-counted), so the bytes in flight no
// longer cost registers; the compute warpgroup reads each group's A fragments from the
// landed stage (its 32 bytes of rows r and r + 8, widened with cvt), while the token codes
// are loaded one group ahead into registers and widened into B (float16, shared memory,
// double-buffered) during the previous group's MMAs.
//
// Layout of the work: block (x, y) owns weight rows 64 x .. 64 x + 63 and the K groups of
// split y. Per 128-wide K group: 8 wgmma.m64n64k16 (A from registers, B from shared
// memory) into a zeroed accumulator, then total += acc * a_s[token, g] * w_s[rows, g] in
// float32 (the block scales change every group). Token columns past M are zeros. Splits
// > 1 write float32 partials that wgmma_decode_reduce adds in split order.
//
// Fragment order: the K order inside a group is free, so thread (r, t) of warp w holds
// rows 16 w + r and + 8, bytes 32 t .. 32 t + 31 of the group; MMA step j takes word j,
// its low half as k slots (2t, 2t + 1) and its high half as (2t + 8, 2t + 9). B's copy of
// the tokens follows the same map. B per K group and step j (2 KB): K-major, no swizzle,
// 8x8 float16 core matrices; core (token block nb, k block kb) at j * 2048 + nb * 256 +
// kb * 128; descriptor leading byte offset 128, stride byte offset 256.

#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

constexpr int TOKENS = 64;                   // token columns of the tile (M <= 64)
constexpr int ROWS = 64;                     // weight rows of a block
constexpr int STEP_BYTES = TOKENS * 16 * 2;  // one k16 slice of B in float16
constexpr int GROUP_BYTES = 8 * STEP_BYTES;  // a 128-wide K group of B: 16 KB

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16, 16-byte aligned addresses) global -> shared by the copy
// engine; completion counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}
// The compute warpgroup's own barrier (named barrier 1; the producer warp does not take part).
__device__ __forceinline__ void compute_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

// wgmma shared-memory matrix descriptor: start address, leading and stride byte offsets
// (all >> 4), base offset 0, no swizzle.
__device__ __forceinline__ uint64_t b_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address >> 4) & 0x3FFF) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Registers the next wgmma reads (A fragments, the accumulator) defined before wgmma_fence:
// an empty volatile asm that "modifies" them keeps their producers above the fence.
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
// Ordinary shared-memory stores made visible to the warpgroup MMA (the async proxy).
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

// One K group's tokens in the compute warpgroup's registers, then widened into B's layout:
// 512 units (token n, half h, chunk t) of 16 code bytes (bytes 32 t + 16 h .. + 15 of the
// group); unit words q = 0..3 are MMA steps j = 4 h + q, their low halves k block 0, high
// halves k block 1, both at element pair t of token row n. Tokens past the batch are zeros.
// Also the group's token scales (zero past the batch).
struct TokenStage {
  static constexpr int UNITS = 512 / 128;
  uint32_t words[UNITS][4];
  float scale;

  __device__ __forceinline__ void load(const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,
                                       long long a_s_stride_g, int g, int m_rows) {
#pragma unroll
    for (int i = 0; i < UNITS; ++i) {
      const int u = threadIdx.x + i * 128;
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
      const int u = threadIdx.x + i * 128;
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

// Shared memory: STAGES stages of the 64 weight rows' bytes of GPS K groups (each row
// padded by 16 bytes: the fragment reads are then free of bank conflicts), two B tiles,
// two sets of token scales, the barriers.
template <int STAGES, int GPS>
struct Layout {
  static constexpr int ROW = GPS * 128 + 16;
  static constexpr int STAGE = ROWS * ROW;
  static constexpr int B_TILES = STAGES * STAGE;  // a multiple of 16, as the descriptors need
  static constexpr int SCALES = B_TILES + 2 * GROUP_BYTES;
  static constexpr int BARRIERS = SCALES + 2 * TOKENS * 4;
  static constexpr int BYTES = BARRIERS + 2 * STAGES * 8;  // wgmma_decode.py's shared_bytes
  static_assert(BYTES <= 227 * 1024, "more shared memory than a Hopper block can have");
};

template <int STAGES, int GPS>
__device__ __forceinline__ void wgmma_decode(const uint8_t* a_q, long long a_stride, const float* a_s,
                                             long long a_s_stride_m, long long a_s_stride_g,
                                             const uint8_t* __restrict__ w_q, long long w_stride,
                                             const float* __restrict__ w_s, long long w_s_stride_n,
                                             long long w_s_stride_g, uint16_t* __restrict__ y, long long y_stride,
                                             float* __restrict__ partial, long long m_rows_ll, long long k,
                                             long long groups_per_split) {
  using L = Layout<STAGES, GPS>;
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* b_tiles = smem + L::B_TILES;                               // [2][GROUP_BYTES]
  float* token_scales = reinterpret_cast<float*>(smem + L::SCALES);  // [2][TOKENS]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::BARRIERS);
  uint64_t* empty = full + STAGES;

  const int m_rows = static_cast<int>(m_rows_ll);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long n0 = static_cast<long long>(blockIdx.x) * ROWS;
  const int groups = static_cast<int>(k >> 7);
  const int g0 = static_cast<int>(blockIdx.y * groups_per_split);
  const int g1 = min(groups, g0 + static_cast<int>(groups_per_split));
  const int chunks = (g1 - g0 + GPS - 1) / GPS;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (warp == 4) {
    // Producer: chunk c (GPS groups from g0 + c * GPS) of the block's 64 rows into stage
    // c % STAGES. The weights are not written by an earlier kernel of the step, so no wait
    // for the previous grid here.
    allow_next_grid();
    for (int c = 0; c < chunks; ++c) {
      const int slot = c % STAGES;
      if (c >= STAGES) barrier_wait(&empty[slot], ((c / STAGES) & 1) ^ 1);
      const int bytes = min(GPS, g1 - g0 - c * GPS) * 128;
      if (lane == 0) barrier_expect_bytes(&full[slot], ROWS * bytes);
      __syncwarp();
      const long long offset = static_cast<long long>(g0 + c * GPS) << 7;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = lane + 32 * h;
        bulk_copy(smem + slot * L::STAGE + row * L::ROW, w_q + (n0 + row) * w_stride + offset, bytes, &full[slot]);
      }
    }
    return;
  }

  // Compute warpgroup: warp w multiplies rows 16 w .. 16 w + 15.
  const int r = lane >> 2, t = lane & 3;
  const long long row = n0 + 16 * warp + r;  // and row + 8
  const float* w_s_block = w_s + (n0 >> 7) * w_s_stride_n;
  float total[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) total[i] = 0.0f;

  allow_next_grid();
  wait_for_previous_grid();
  const uint8_t* tokens = after_wait(a_q);
  TokenStage tok;
  if (g0 < g1) {
    tok.load(tokens, a_stride, a_s, a_s_stride_m, a_s_stride_g, g0, m_rows);
    tok.store(b_tiles, token_scales);
    if (g0 + 1 < g1) tok.load(tokens, a_stride, a_s, a_s_stride_m, a_s_stride_g, g0 + 1, m_rows);
  }
  fence_shared_for_mma();
  compute_sync();

  for (int g = g0; g < g1; ++g) {
    const int i = g - g0, c = i / GPS, q = i % GPS, slot = c % STAGES, buf = i & 1;
    if (q == 0) barrier_wait(&full[slot], (c / STAGES) & 1);
    // A fragments of the 8 steps from the landed stage: rows r and r + 8 of this warp.
    const uint8_t* w0 = smem + slot * L::STAGE + (16 * warp + r) * L::ROW + q * 128 + lane_offset(t);
    uint4 p[4];
    p[0] = *reinterpret_cast<const uint4*>(w0);
    p[1] = *reinterpret_cast<const uint4*>(w0 + SECOND_PIECE);
    p[2] = *reinterpret_cast<const uint4*>(w0 + 8 * L::ROW);
    p[3] = *reinterpret_cast<const uint4*>(w0 + 8 * L::ROW + SECOND_PIECE);
    auto word = [](const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; };
    uint32_t a[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t lo = word(p[j >> 2], j & 3), hi = word(p[2 + (j >> 2)], j & 3);
      a[j][0] = e4m3x2_to_f16x2(lo);        // row r,     slots 2t, 2t + 1
      a[j][1] = e4m3x2_to_f16x2(hi);        // row r + 8, slots 2t, 2t + 1
      a[j][2] = e4m3x2_to_f16x2(lo >> 16);  // row r,     slots 2t + 8, 2t + 9
      a[j][3] = e4m3x2_to_f16x2(hi >> 16);  // row r + 8, slots 2t + 8, 2t + 9
    }
    if (q == GPS - 1 || g + 1 == g1) {  // this warp's reads of the stage are done
      __syncwarp();
      if (lane == 0) barrier_arrive(&empty[slot]);
    }
    float acc[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) pin(a[j]);
    pin(acc);
    wgmma_fence();
    const uint32_t b_base = shared_address(b_tiles + buf * GROUP_BYTES);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      wgmma_64x64x16(acc, a[j][0], a[j][1], a[j][2], a[j][3], b_descriptor(b_base + j * STEP_BYTES), j);
    }
    wgmma_commit();
    if (g + 1 < g1) {
      // while the MMAs run: group g + 1's tokens into the other B tile (last read by group
      // g - 1's MMAs, which every thread waited for before the previous barrier)
      tok.store(b_tiles + (buf ^ 1) * GROUP_BYTES, token_scales + (buf ^ 1) * TOKENS);
      if (g + 2 < g1) tok.load(tokens, a_stride, a_s, a_s_stride_m, a_s_stride_g, g + 2, m_rows);
    }
    wgmma_wait_all();
    // acc[4 c + e]: row r (e < 2) or r + 8, token column 8 c + 2 t + (e & 1)
    const float w_scale = w_s_block[g * w_s_stride_g];
    const float* scales = token_scales + buf * TOKENS;
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) {
      const float s0 = scales[8 * cc + 2 * t] * w_scale;
      const float s1 = scales[8 * cc + 2 * t + 1] * w_scale;
      total[4 * cc + 0] += acc[4 * cc + 0] * s0;
      total[4 * cc + 1] += acc[4 * cc + 1] * s1;
      total[4 * cc + 2] += acc[4 * cc + 2] * s0;
      total[4 * cc + 3] += acc[4 * cc + 3] * s1;
    }
    fence_shared_for_mma();
    compute_sync();
  }

  // Out: BF16 (one split) or this split's float32 partial, token columns that exist.
#pragma unroll
  for (int cc = 0; cc < 8; ++cc) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 8 * cc + 2 * t + (e & 1);
      const long long n = row + (e >> 1) * 8;
      if (m < m_rows) {
        if (gridDim.y == 1) {
          y[m * y_stride + n] = f32_to_bf16_rne(total[4 * cc + e]);
        } else {
          partial[(static_cast<long long>(blockIdx.y) * m_rows + m) * (gridDim.x * ROWS) + n] = total[4 * cc + e];
        }
      }
    }
  }
}

}  // namespace

// MIN_BLOCKS: resident blocks per multiprocessor the registers are capped for (2: 166
// registers, no spill; 3: 128 registers and a 36-byte spill).
#define QUANTROLL_WGMMA_DECODE(STAGES, GPS, MIN_BLOCKS)                                                       \
  extern "C" __global__ void __launch_bounds__(160, MIN_BLOCKS) wgmma_decode_s##STAGES##_g##GPS##_b##MIN_BLOCKS( \
      const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m, long long a_s_stride_g, \
      const uint8_t* w_q, long long w_stride, const float* w_s, long long w_s_stride_n, long long w_s_stride_g, \
      uint16_t* y, long long y_stride, float* partial, long long m_rows, long long k, long long groups_per_split) { \
    wgmma_decode<STAGES, GPS>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s, w_s_stride_n, \
                              w_s_stride_g, y, y_stride, partial, m_rows, k, groups_per_split);              \
  }

// (stages, K groups per stage, blocks per multiprocessor): wgmma_decode.py's VARIANTS
QUANTROLL_WGMMA_DECODE(4, 1, 2)
QUANTROLL_WGMMA_DECODE(6, 1, 2)
QUANTROLL_WGMMA_DECODE(3, 2, 2)
QUANTROLL_WGMMA_DECODE(4, 2, 2)
QUANTROLL_WGMMA_DECODE(4, 1, 3)
QUANTROLL_WGMMA_DECODE(3, 1, 3)

// The splits' float32 partials [splits, M, N] added in split order, BF16 (round to nearest
// even) out: one thread per output.
extern "C" __global__ void __launch_bounds__(256) wgmma_decode_reduce(const float* partial, long long splits,
                                                                      long long m_rows, long long n_cols,
                                                                      uint16_t* y, long long y_stride) {
  const long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= m_rows * n_cols) return;
  const long long m = i / n_cols, n = i % n_cols;
  float sum = 0.0f;
  for (long long s = 0; s < splits; ++s) sum += partial[(s * m_rows + m) * n_cols + n];
  y[m * y_stride + n] = quantroll_gemv::f32_to_bf16_rne(sum);
}

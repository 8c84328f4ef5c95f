// Building blocks of the warpgroup-MMA decode GEMM (fp8_wgmma_ws.cu): the
// token tile's shared-memory layout, wgmma and its fences, a thread's weight fragments,
// the widening of token codes into the tile, and the end of a block (split-K sums, BF16
// store). Per thread and pure; the kernels say how the work is laid out. sm_90a only.
// N is the tile's token rows (wgmma's n: 16, 32 or 64; rows past the batch are zero).
//
// The token tile (wgmma's B operand, K-major, no swizzle): per k16 step j of a 128-wide K
// group a block of 8x2 core matrices (8 token rows x 16 bytes), the two K halves
// LEADING_BYTES apart and 8-token groups STRIDE_BYTES apart. K order inside a group is
// free (a dot product does not care), so a thread of the weight side reads 32 contiguous
// bytes of each of its rows (quarter t = lane % 4: bytes 32 t .. 32 t + 31) and step j
// takes word j of them: A slots (2t, 2t+1) <- bytes 32t + 4j + {0, 1}, slots (2t+8, 2t+9)
// <- bytes 32t + 4j + {2, 3}; the token tile puts each token's bytes in the same places.

#pragma once

#include "gemv_fragments.cuh"

namespace quantroll_wgmma {

using namespace quantroll_gemv;

constexpr int LEADING_BYTES = 128;  // K-direction offset of the two core matrices
constexpr int STRIDE_BYTES = 256;   // offset of consecutive 8-token groups
template <int N>
__host__ __device__ constexpr int step_bytes() { return N * 16 * 2; }  // one k16 step of float16 tokens
template <int N>
__host__ __device__ constexpr int slot_bytes() { return 8 * step_bytes<N>(); }  // one 128-wide K group
// The 16-byte pieces of one group's token codes (N tokens x 128 bytes).
template <int N>
__host__ __device__ constexpr int pieces() { return N * 8; }

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// wgmma's shared-memory matrix descriptor: start address, leading and stride byte offsets
// (all >> 4), no swizzle (layout type 0 in bits 62-63), base offset 0.
__device__ __forceinline__ uint64_t b_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (static_cast<uint64_t>(LEADING_BYTES >> 4) << 16) |
         (static_cast<uint64_t>(STRIDE_BYTES >> 4) << 32);
}

// Keep the compiler from moving reads or writes of the accumulator across wgmma's
// asynchronous window.
template <int C>
__device__ __forceinline__ void fence_operands(float (&d)[C]) {
#pragma unroll
  for (int i = 0; i < C; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Wait until at most one wgmma group (the last committed) is still running.
__device__ __forceinline__ void wgmma_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// Generic-proxy writes to shared memory (the widened tokens) made visible to wgmma's reads.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// d (+)= A B for one k16 step: A = 64 weight rows x 16 (float16 pairs in registers), B =
// 16 x N tokens in shared memory; accumulate = 0 starts the sum afresh. d holds N / 2
// floats per thread: per 8-token block j, rows r and r + 8 for tokens 8j + 2t, 8j + 2t + 1.
template <int N>
__device__ __forceinline__ void wgmma_step(float (&d)[N / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint64_t b, int accumulate) {
  if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(accumulate));
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(accumulate));
  } else {
    static_assert(N == 64, "wgmma tiles of 16, 32 or 64 tokens");
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
}

// A launch's arguments, in the order fp8_wgmma.py passes them (QUANTROLL_WGMMA_PARAMS
// declares them as a kernel's parameters, QUANTROLL_WGMMA_ARGS collects them).
struct GemmArgs {
  const uint8_t* a_q;
  long long a_stride;
  const float* a_s;
  long long a_s_stride_m, a_s_stride_g;
  const uint8_t* w_q;
  long long w_stride;
  const float* w_s;
  long long w_s_stride_n, w_s_stride_g;
  uint16_t* y;
  long long y_stride;
  float* scratch;
  int* tile_counters;
  long long m_rows, n, k, per_split;
  long long silu_inter;  // > 0: a_q is a BF16 gate_up [M, 2 * silu_inter], the input silu(gate) * up

  // Token g's (row n's) codes of K group g, and its scale.
  __device__ __forceinline__ const uint8_t* token_group(int n, int g) const {
    return a_q + n * a_stride + (static_cast<long long>(g) << 7);
  }
  __device__ __forceinline__ const float* token_scale(int n, int g) const {
    return a_s + n * a_s_stride_m + g * a_s_stride_g;
  }
};

#define QUANTROLL_WGMMA_PARAMS                                                                             \
  const uint8_t *a_q, long long a_stride, const float *a_s, long long a_s_stride_m, long long a_s_stride_g,    \
      const uint8_t *w_q, long long w_stride, const float *w_s, long long w_s_stride_n, long long w_s_stride_g, \
      uint16_t *y, long long y_stride, float *scratch, int *tile_counters, long long m_rows, long long n,      \
      long long k, long long per_split, long long silu_inter
#define QUANTROLL_WGMMA_ARGS                                                                                 \
  GemmArgs {                                                                                                 \
    a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s, w_s_stride_n, w_s_stride_g, y,        \
        y_stride, scratch, tile_counters, m_rows, n, k, per_split, silu_inter                                \
  }

// A thread's weight bytes of one K group (rows r and r + 8 of its warp, 32 bytes each)
// and the group's weight scale.
struct WeightGroup {
  uint32_t w0[8];
  uint32_t w1[8];
  float scale;
};

template <bool PINNED>
__device__ __forceinline__ void load_group(WeightGroup& grp, const uint8_t* row0, long long w_stride, int g,
                                           const float* w_s_block, long long w_s_stride_g) {
  const uint8_t* p0 = row0 + (static_cast<long long>(g) << 7);
  const uint8_t* p1 = p0 + 8 * w_stride;
  Words4 v = load_stream<PINNED>(p0);
#pragma unroll
  for (int i = 0; i < 4; ++i) grp.w0[i] = v.w[i];
  v = load_stream<PINNED>(p0 + SECOND_PIECE);
#pragma unroll
  for (int i = 0; i < 4; ++i) grp.w0[4 + i] = v.w[i];
  v = load_stream<PINNED>(p1);
#pragma unroll
  for (int i = 0; i < 4; ++i) grp.w1[i] = v.w[i];
  v = load_stream<PINNED>(p1 + SECOND_PIECE);
#pragma unroll
  for (int i = 0; i < 4; ++i) grp.w1[4 + i] = v.w[i];
  grp.scale = w_s_block[g * w_s_stride_g];
}

// Where a multiplying thread of a block of ``rows`` weight rows works: lane, warp, fragment
// row r and quarter t, its weight row (warp w holds rows 16 w + {r, r + 8}), the block's K
// groups [first, first + count) of split blockIdx.y, and where its weight bytes and the
// block's weight scales start.
struct WeightSide {
  int lane, warp, r, t, first, count;
  long long row;
  const uint8_t* row0;
  const float* w_s_block;
  long long w_stride, w_s_stride_g;

  __device__ __forceinline__ WeightSide(const GemmArgs& g, int rows) {
    lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
    r = lane >> 2;
    t = lane & 3;
    const long long n0 = static_cast<long long>(blockIdx.x) * rows;
    row = n0 + 16 * warp + r;
    first = static_cast<int>(blockIdx.y * g.per_split);
    count = min(static_cast<int>(g.k >> 7) - first, static_cast<int>(g.per_split));
    row0 = g.w_q + row * g.w_stride + lane_offset(t);
    w_s_block = g.w_s + (n0 >> 7) * g.w_s_stride_n;
    w_stride = g.w_stride;
    w_s_stride_g = g.w_s_stride_g;
  }

  // Request the block's c-th K group of this thread's weight bytes into grp.
  template <bool PINNED>
  __device__ __forceinline__ void load(WeightGroup& grp, int c) const {
    load_group<PINNED>(grp, row0, w_stride, first + c, w_s_block, w_s_stride_g);
  }
};

// Piece p of a group's token codes: token 8 (p >> 6) + ((p >> 2) & 7), quarter t = p & 3,
// half (p >> 5) & 1 of that quarter, i.e. bytes 32 t + 16 half .. of the token's group.
// The order makes the widened stores of 32 consecutive pieces (one warp) hit 32 different
// banks.
struct Piece {
  int n, t, half;
  __device__ __forceinline__ explicit Piece(int p) : n(8 * (p >> 6) + ((p >> 2) & 7)), t(p & 3), half((p >> 5) & 1) {}
  __device__ __forceinline__ int byte() const { return 32 * t + 16 * half; }
};

// Widen one piece's 16 codes (k16 steps 4 half .. 4 half + 3 of its quarter) into the tile.
template <int N>
__device__ __forceinline__ void widen_piece(uint8_t* tile, const Piece& pc, uint4 v) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  uint8_t* base = tile + (pc.n >> 3) * STRIDE_BYTES + (pc.n & 7) * 16 + 4 * pc.t + pc.half * 4 * step_bytes<N>();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    *reinterpret_cast<uint32_t*>(base + j * step_bytes<N>()) = e4m3x2_to_f16x2(words[j]);  // k + {0, 1}
    *reinterpret_cast<uint32_t*>(base + j * step_bytes<N>() + LEADING_BYTES) = e4m3x2_to_f16x2(words[j] >> 16);
  }
}

// A thread's A fragments of one group: k16 step j from word j of its rows r and r + 8.
__device__ __forceinline__ void to_fragments(const WeightGroup& grp, uint32_t (&a)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    a[j][0] = e4m3x2_to_f16x2(grp.w0[j]);        // row r,     k + {0, 1}
    a[j][1] = e4m3x2_to_f16x2(grp.w1[j]);        // row r + 8, k + {0, 1}
    a[j][2] = e4m3x2_to_f16x2(grp.w0[j] >> 16);  // row r,     k + {2, 3}
    a[j][3] = e4m3x2_to_f16x2(grp.w1[j] >> 16);  // row r + 8, k + {2, 3}
  }
}

// part = the group's code products (8 wgmma on the tile at shared address ``tile``),
// committed as one wgmma group; the caller waits (wgmma_wait_all) before reading part.
template <int N>
__device__ __forceinline__ void issue_group(const uint32_t (&a)[8][4], uint32_t tile, float (&part)[N / 2]) {
  fence_operands(part);
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    wgmma_step<N>(part, a[j][0], a[j][1], a[j][2], a[j][3], b_descriptor(tile + j * step_bytes<N>()), j);
  }
  wgmma_commit();
}

// total += part x (token scale x weight scale).
template <int N>
__device__ __forceinline__ void add_scaled(float (&total)[N / 2], float (&part)[N / 2], const float* scales,
                                           float w_scale, int t) {
  fence_operands(part);
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const float s0 = scales[8 * j + 2 * t] * w_scale;
    const float s1 = scales[8 * j + 2 * t + 1] * w_scale;
    total[4 * j + 0] += part[4 * j + 0] * s0;  // row r,     token 8j + 2t
    total[4 * j + 1] += part[4 * j + 1] * s1;  // row r,     token 8j + 2t + 1
    total[4 * j + 2] += part[4 * j + 2] * s0;  // row r + 8, token 8j + 2t
    total[4 * j + 3] += part[4 * j + 3] * s1;  // row r + 8, token 8j + 2t + 1
  }
}

// The end of a block of the multiplying threads: with one split, BF16 out; with more, this
// split's sums to scratch [split][N_weights][N], and the block that arrives last at its
// tile's counter adds the splits in split order (the same result on every run), stores
// BF16 and resets the counter for the next launch. ``sync`` is a barrier over exactly the
// multiplying threads; ``last_block`` a shared flag.
template <int N, typename Sync>
__device__ __forceinline__ void finish(float (&total)[N / 2], const WeightSide& at, const GemmArgs& g, int& last_block,
                                       Sync sync) {
  const long long row = at.row, n_ll = g.n, y_stride = g.y_stride;
  const int t = at.t, m_rows = static_cast<int>(g.m_rows);
  uint16_t* __restrict__ y = g.y;
  float* __restrict__ scratch = g.scratch;
  int* __restrict__ tile_counters = g.tile_counters;
  const int splits = static_cast<int>(gridDim.y);
  if (splits > 1) {
    float* mine = scratch + (static_cast<long long>(blockIdx.y) * n_ll + row) * N;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      *reinterpret_cast<float2*>(mine + 8 * j + 2 * t) = make_float2(total[4 * j + 0], total[4 * j + 1]);
      *reinterpret_cast<float2*>(mine + 8 * N + 8 * j + 2 * t) = make_float2(total[4 * j + 2], total[4 * j + 3]);
    }
    __threadfence();
    sync();
    if (threadIdx.x == 0) last_block = atomicAdd(&tile_counters[blockIdx.x], 1) == splits - 1;
    sync();
    if (!last_block) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < N / 2; ++i) total[i] = 0.0f;
    const float* own = scratch + row * N;
    for (int s = 0; s < splits; ++s) {
      const float* src = own + static_cast<long long>(s) * n_ll * N;
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        const float2 lo = __ldcg(reinterpret_cast<const float2*>(src + 8 * j + 2 * t));
        const float2 hi = __ldcg(reinterpret_cast<const float2*>(src + 8 * N + 8 * j + 2 * t));
        total[4 * j + 0] += lo.x;
        total[4 * j + 1] += lo.y;
        total[4 * j + 2] += hi.x;
        total[4 * j + 3] += hi.y;
      }
    }
    if (threadIdx.x == 0) tile_counters[blockIdx.x] = 0;
  }
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const int m = 8 * j + 2 * t;
    if (m < m_rows) {
      y[m * y_stride + row] = f32_to_bf16_rne(total[4 * j + 0]);
      y[m * y_stride + row + 8] = f32_to_bf16_rne(total[4 * j + 2]);
    }
    if (m + 1 < m_rows) {
      y[(m + 1) * y_stride + row] = f32_to_bf16_rne(total[4 * j + 1]);
      y[(m + 1) * y_stride + row + 8] = f32_to_bf16_rne(total[4 * j + 3]);
    }
  }
}

}  // namespace quantroll_wgmma

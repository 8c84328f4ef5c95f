// Block-FP8 decode GEMM for 17-64 token rows on Hopper's warpgroup MMA (sm_90a):
// y = (a_q * a_s) @ (w_q * w_s)^T, 1x128 activation scales, 128x128 weight scales, BF16
// output, float32-accurate (exact float16 products of the codes, float32 sums).
//
// Why: at 64 token rows mma.sync (fp8_gemv.cu, Triton's decode kernel) must fetch every
// token fragment from shared memory or L1 once per 16 weight rows, and its issue slots and
// shared-memory bandwidth, not the weight bytes, set the pace (Triton: ~104 us per Qwen3-8B
// layer set for ~45 us of bytes). wgmma reads the token operand (B) from shared memory
// itself, once per warpgroup instruction for 64 weight rows, and takes the weight operand
// (A) from registers, so the FP8 weights are still streamed with 16-byte loads straight
// into registers and widened there (e4m3 -> float16 is exact), never staged.
//
// Layout of the work: a block of WG warpgroups owns 64 * WG weight rows (one 128-row scale
// block at most) and the K groups [first, first + per_split) of split blockIdx.y; warp w
// holds rows 16 w + {r, r + 8} (r = lane / 4), the A fragment of wgmma.m64n64k16. K order
// inside a 128-wide group is free, so as in fp8_gemv.cu a thread reads 32 contiguous bytes
// of each of its rows per group (t = lane % 4: bytes 32 t .. 32 t + 31) and k16 step j of
// the group takes word j of them: A slots (2t, 2t+1) <- bytes 32t + 4j + {0, 1} and slots
// (2t+8, 2t+9) <- bytes 32t + 4j + {2, 3}. The block widens the group's token codes into
// shared memory in the same order, as wgmma's K-major, unswizzled B layout: per k16 step a
// 2 KB tile of 8x2 core matrices (8 token rows x 16 bytes each), the two K halves 128 bytes
// apart (leading byte offset) and 8-token groups 256 bytes apart (stride byte offset).
// Token rows past the batch are zero (the tile is always 64 wide).
//
// Per group a warpgroup issues 8 wgmma (one per k16 step) into a partial accumulator,
// waits, and adds partial * (token scale x weight scale) into the float32 total: the same
// sum the other decode GEMMs form, in another order. The next group's tokens are loaded
// and widened into the other of two shared-memory slots while the MMAs run; one barrier
// per group. Weight bytes are requested two groups ahead (two register buffers).
//
// Splits > 1: each block writes its float32 sums to scratch [split][N][64]; the block that
// arrives last at its tile's counter adds the splits in split order (the same result on
// every run), stores BF16 and resets the counter for the next launch.
//
// Launch: the first two groups of weight bytes are requested before waiting for the
// previous kernel (programmatic dependent launch, as fp8_gemv.cu), tokens only after.

#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

constexpr int TOKENS = 64;                      // wgmma N: token rows of the tile
constexpr int STEP_BYTES = TOKENS * 16 * 2;     // one k16 step of float16 tokens: 2 KB
constexpr int SLOT_BYTES = 8 * STEP_BYTES;      // one 128-wide K group: 16 KB
constexpr int LEADING_BYTES = 128;              // K-direction offset of the two core matrices
constexpr int STRIDE_BYTES = 256;               // offset of consecutive 8-token groups

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
__device__ __forceinline__ void fence_operands(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Generic-proxy writes to shared memory (the widened tokens) made visible to wgmma's reads.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// d (+)= A B for one k16 step: A = 64 weight rows x 16 (float16 pairs in registers), B =
// 16 x 64 tokens in shared memory; accumulate = 0 starts the sum afresh.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
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

// Asynchronous copies of the token codes into shared memory (cp.async): no registers hold
// them in flight. src_bytes 0 writes zeros (token rows past the batch).
__device__ __forceinline__ void copy_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void copy_async_4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(shared_address(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void copy_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

constexpr int RAW_BYTES = TOKENS * 128;         // one group's token codes: 8 KB
constexpr int RAW_SLOTS = 3;                    // groups c (scales in use), c + 1 (landing), c + 2 (requested)
constexpr int PIECES = RAW_BYTES / 16;          // 16-byte pieces of a group's codes

struct Shared {
  uint8_t tokens[2][SLOT_BYTES];                // widened, wgmma's layout; group c in slot c % 2
  uint8_t raw[RAW_SLOTS][RAW_BYTES];            // codes as copied, [token][128]; group c in slot c % 3
  float scales[RAW_SLOTS][TOKENS];              // token scales of the same groups
};

// Request group g's token codes and scales (this thread's pieces: p = threadIdx.x + i *
// THREADS, token p / 8, bytes 16 (p % 8) ..) into raw slot ``slot``; one commit group.
template <int THREADS>
__device__ __forceinline__ void request_tokens(Shared& sh, int slot, const uint8_t* a_q, long long a_stride,
                                               const float* a_s, long long a_s_stride_m, long long a_s_stride_g,
                                               int m_rows, int g) {
#pragma unroll
  for (int i = 0; i < PIECES / THREADS; ++i) {
    const int p = threadIdx.x + i * THREADS;
    const int n = p >> 3;
    const bool real = n < m_rows;
    const uint8_t* src = a_q + (real ? n : 0) * a_stride + (static_cast<long long>(g) << 7) + 16 * (p & 7);
    copy_async_16(sh.raw[slot] + 16 * p, src, real ? 16 : 0);
  }
  if (threadIdx.x < TOKENS) {
    const int n = threadIdx.x;
    const bool real = n < m_rows;
    copy_async_4(&sh.scales[slot][n], a_s + (real ? n : 0) * a_s_stride_m + g * a_s_stride_g, real ? 4 : 0);
  }
  copy_async_commit();
}

// Widen this thread's pieces of raw slot ``raw`` into token slot ``dst`` (after its own
// copies landed: no barrier needed before, one after). Piece p holds bytes 16 (p % 8) ..
// of token p / 8: quarter t = (p % 8) / 2, words 4 ((p % 8) % 2) + {0..3} = k16 steps j.
template <int THREADS>
__device__ __forceinline__ void widen_tokens(Shared& sh, int raw, int dst) {
#pragma unroll
  for (int i = 0; i < PIECES / THREADS; ++i) {
    const int p = threadIdx.x + i * THREADS;
    const int n = p >> 3, q = p & 7, t = q >> 1;
    const uint4 v = *reinterpret_cast<const uint4*>(sh.raw[raw] + 16 * p);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    uint8_t* base = sh.tokens[dst] + (n >> 3) * STRIDE_BYTES + (n & 7) * 16 + 4 * t + (q & 1) * 4 * STEP_BYTES;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<uint32_t*>(base + j * STEP_BYTES) = e4m3x2_to_f16x2(words[j]);
      *reinterpret_cast<uint32_t*>(base + j * STEP_BYTES + LEADING_BYTES) = e4m3x2_to_f16x2(words[j] >> 16);
    }
  }
}

template <int WG, int DEPTH>
__device__ __forceinline__ void fp8_wgmma(const uint8_t* a_q, long long a_stride, const float* a_s,
                                          long long a_s_stride_m, long long a_s_stride_g,
                                          const uint8_t* __restrict__ w_q, long long w_stride,
                                          const float* __restrict__ w_s, long long w_s_stride_n,
                                          long long w_s_stride_g, uint16_t* __restrict__ y, long long y_stride,
                                          float* __restrict__ scratch, int* __restrict__ tile_counters,
                                          long long m_rows_ll, long long n_ll, long long k, long long per_split) {
  constexpr int THREADS = 128 * WG;
  constexpr int ROWS = 64 * WG;
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  __shared__ int last_block;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, t = lane & 3;
  const int m_rows = static_cast<int>(m_rows_ll);
  const long long n0 = static_cast<long long>(blockIdx.x) * ROWS;
  const long long row = n0 + 16 * warp + r;
  const int groups = static_cast<int>(k >> 7);
  const int first = static_cast<int>(blockIdx.y * per_split);
  const int count = min(groups - first, static_cast<int>(per_split));
  const uint8_t* row0 = w_q + row * w_stride + lane_offset(t);
  const float* w_s_block = w_s + (n0 >> 7) * w_s_stride_n;

  // DEPTH groups of weight bytes in flight per thread, the first ones requested before
  // waiting for the previous kernel.
  WeightGroup buf[DEPTH];
#pragma unroll
  for (int u = 0; u < DEPTH; ++u) {
    if (u < count) load_group<true>(buf[u], row0, w_stride, first + u, w_s_block, w_s_stride_g);
  }
  allow_next_grid();
  wait_for_previous_grid();
  a_q = after_wait(a_q);

  request_tokens<THREADS>(sh, 0, a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, m_rows, first);
  if (count > 1) request_tokens<THREADS>(sh, 1, a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, m_rows, first + 1);
  else copy_async_commit();
  copy_async_wait<1>();
  widen_tokens<THREADS>(sh, 0, 0);
  fence_async_shared();
  __syncthreads();

  float total[32], part[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) total[i] = 0.0f;

  // Group c (token slot c % 2, raw slot c % 3) from grp, whose registers then take group
  // c + DEPTH; meanwhile group c + 2's codes are requested and group c + 1's widened.
  auto group = [&](WeightGroup& grp, int c) {
    if (c + 2 < count) {
      request_tokens<THREADS>(sh, (c + 2) % RAW_SLOTS, a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, m_rows,
                              first + c + 2);
    } else {
      copy_async_commit();  // an empty group keeps the wait counts uniform
    }
    uint32_t a[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      a[j][0] = e4m3x2_to_f16x2(grp.w0[j]);        // row r,     k + {0, 1}
      a[j][1] = e4m3x2_to_f16x2(grp.w1[j]);        // row r + 8, k + {0, 1}
      a[j][2] = e4m3x2_to_f16x2(grp.w0[j] >> 16);  // row r,     k + {2, 3}
      a[j][3] = e4m3x2_to_f16x2(grp.w1[j] >> 16);  // row r + 8, k + {2, 3}
    }
    const float w_scale = grp.scale;
    if (c + DEPTH < count) load_group<true>(grp, row0, w_stride, first + c + DEPTH, w_s_block, w_s_stride_g);
    const uint32_t base = shared_address(sh.tokens[c & 1]);
    fence_operands(part);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 8; ++j) wgmma_m64n64k16(part, a[j][0], a[j][1], a[j][2], a[j][3], b_descriptor(base + j * STEP_BYTES), j);
    wgmma_commit();
    if (c + 1 < count) {
      copy_async_wait<1>();  // group c + 1's codes (this thread's pieces) have landed
      widen_tokens<THREADS>(sh, (c + 1) % RAW_SLOTS, (c + 1) & 1);
    }
    wgmma_wait_all();
    fence_operands(part);
    const float* scales = sh.scales[c % RAW_SLOTS];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float s0 = scales[8 * j + 2 * t] * w_scale;
      const float s1 = scales[8 * j + 2 * t + 1] * w_scale;
      total[4 * j + 0] += part[4 * j + 0] * s0;  // row r,     token 8j + 2t
      total[4 * j + 1] += part[4 * j + 1] * s1;  // row r,     token 8j + 2t + 1
      total[4 * j + 2] += part[4 * j + 2] * s0;  // row r + 8, token 8j + 2t
      total[4 * j + 3] += part[4 * j + 3] * s1;  // row r + 8, token 8j + 2t + 1
    }
    fence_async_shared();
    __syncthreads();  // group c + 1's tokens are widened and visible; slot c % 2 is free again
  };

  for (int c0 = 0; c0 < count; c0 += DEPTH) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      if (c0 + u < count) group(buf[u], c0 + u);
    }
  }
  copy_async_wait<0>();

  const int splits = static_cast<int>(gridDim.y);
  if (splits > 1) {
    // This split's sums to scratch [split][N][64]; the tile's last block adds them in order.
    float* mine = scratch + (static_cast<long long>(blockIdx.y) * n_ll + row) * TOKENS;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<float2*>(mine + 8 * j + 2 * t) = make_float2(total[4 * j + 0], total[4 * j + 1]);
      *reinterpret_cast<float2*>(mine + 8 * TOKENS + 8 * j + 2 * t) = make_float2(total[4 * j + 2], total[4 * j + 3]);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last_block = atomicAdd(&tile_counters[blockIdx.x], 1) == splits - 1;
    __syncthreads();
    if (!last_block) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < 32; ++i) total[i] = 0.0f;
    const float* own = scratch + row * TOKENS;
    for (int s = 0; s < splits; ++s) {
      const float* src = own + static_cast<long long>(s) * n_ll * TOKENS;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 lo = __ldcg(reinterpret_cast<const float2*>(src + 8 * j + 2 * t));
        const float2 hi = __ldcg(reinterpret_cast<const float2*>(src + 8 * TOKENS + 8 * j + 2 * t));
        total[4 * j + 0] += lo.x;
        total[4 * j + 1] += lo.y;
        total[4 * j + 2] += hi.x;
        total[4 * j + 3] += hi.y;
      }
    }
    if (threadIdx.x == 0) tile_counters[blockIdx.x] = 0;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
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

// ---- Warp-specialized variant: PW producer warps widen the tokens into a ring of SLOTS
// slots, the WG consumer warpgroups multiply; mbarriers (full: tokens ready; empty: every
// consumer warp done with the slot) instead of block-wide barriers.

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}
// Wait until phase number ``parity`` (mod 2) of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}
template <int THREADS>
__device__ __forceinline__ void sync_threads_named() {
  asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
}

template <int SLOTS>
struct Ring {
  uint8_t tokens[SLOTS][SLOT_BYTES];
  float scales[SLOTS][TOKENS];
  uint64_t full[SLOTS];
  uint64_t empty[SLOTS];
};

// A producer thread's token pieces of one group: PP pieces of 16 bytes (piece p = ptid + i *
// PRODUCERS: token p / 8, bytes 16 (p % 8) ..), and the scale of token ptid (ptid < 64).
template <int PP>
struct ProducerPieces {
  uint4 v[PP];
  float scale;
};

template <int PP, int PRODUCERS>
__device__ __forceinline__ void producer_load(ProducerPieces<PP>& pc, int ptid, const uint8_t* a_q, long long a_stride,
                                              const float* a_s, long long a_s_stride_m, long long a_s_stride_g,
                                              int m_rows, int g) {
#pragma unroll
  for (int i = 0; i < PP; ++i) {
    const int p = ptid + i * PRODUCERS;
    const int n = p >> 3;
    if (n < m_rows) {
      const Words4 w = load_cached(a_q + n * a_stride + (static_cast<long long>(g) << 7) + 16 * (p & 7));
      pc.v[i] = make_uint4(w.w[0], w.w[1], w.w[2], w.w[3]);
    } else {
      pc.v[i] = make_uint4(0, 0, 0, 0);
    }
  }
  pc.scale = ptid < m_rows && ptid < TOKENS ? a_s[ptid * a_s_stride_m + g * a_s_stride_g] : 0.0f;
}

template <int PP, int PRODUCERS>
__device__ __forceinline__ void producer_store(const ProducerPieces<PP>& pc, int ptid, uint8_t* slot, float* scales) {
#pragma unroll
  for (int i = 0; i < PP; ++i) {
    const int p = ptid + i * PRODUCERS;
    const int n = p >> 3, q = p & 7, t = q >> 1;
    const uint32_t words[4] = {pc.v[i].x, pc.v[i].y, pc.v[i].z, pc.v[i].w};
    uint8_t* base = slot + (n >> 3) * STRIDE_BYTES + (n & 7) * 16 + 4 * t + (q & 1) * 4 * STEP_BYTES;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<uint32_t*>(base + j * STEP_BYTES) = e4m3x2_to_f16x2(words[j]);
      *reinterpret_cast<uint32_t*>(base + j * STEP_BYTES + LEADING_BYTES) = e4m3x2_to_f16x2(words[j] >> 16);
    }
  }
  if (ptid < TOKENS) scales[ptid] = pc.scale;
}

template <int WG, int PW, int DEPTH, int SLOTS>
__device__ __forceinline__ void fp8_wgmma_ws(const uint8_t* a_q, long long a_stride, const float* a_s,
                                             long long a_s_stride_m, long long a_s_stride_g,
                                             const uint8_t* __restrict__ w_q, long long w_stride,
                                             const float* __restrict__ w_s, long long w_s_stride_n,
                                             long long w_s_stride_g, uint16_t* __restrict__ y, long long y_stride,
                                             float* __restrict__ scratch, int* __restrict__ tile_counters,
                                             long long m_rows_ll, long long n_ll, long long k, long long per_split) {
  constexpr int CONSUMERS = 128 * WG;
  constexpr int PRODUCERS = 32 * PW;
  constexpr int ROWS = 64 * WG;
  constexpr int PP = PIECES / PRODUCERS;
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  Ring<SLOTS>& ring = *reinterpret_cast<Ring<SLOTS>*>(shared_bytes);
  __shared__ int last_block;

  const int m_rows = static_cast<int>(m_rows_ll);
  const int groups = static_cast<int>(k >> 7);
  const int first = static_cast<int>(blockIdx.y * per_split);
  const int count = min(groups - first, static_cast<int>(per_split));
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      mbar_init(&ring.full[s], PRODUCERS);
      mbar_init(&ring.empty[s], CONSUMERS / 32);
    }
  }
  __syncthreads();
  allow_next_grid();

  if (threadIdx.x >= CONSUMERS) {  // producer warps: the only ones that read the previous kernel's output
    const int ptid = threadIdx.x - CONSUMERS;
    wait_for_previous_grid();
    a_q = after_wait(a_q);
    ProducerPieces<PP> pa, pb;
    producer_load<PP, PRODUCERS>(pa, ptid, a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, m_rows, first);
    auto produce = [&](ProducerPieces<PP>& cur, ProducerPieces<PP>& nxt, int c) {
      if (c + 1 < count) producer_load<PP, PRODUCERS>(nxt, ptid, a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, m_rows, first + c + 1);
      const int slot = c % SLOTS;
      if (c >= SLOTS) mbar_wait(&ring.empty[slot], ((c / SLOTS) + 1) & 1);
      producer_store<PP, PRODUCERS>(cur, ptid, ring.tokens[slot], ring.scales[slot]);
      fence_async_shared();
      mbar_arrive(&ring.full[slot]);
    };
    for (int c = 0; c < count; c += 2) {
      produce(pa, pb, c);
      if (c + 1 >= count) break;
      produce(pb, pa, c + 1);
    }
    return;
  }

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, t = lane & 3;
  const long long n0 = static_cast<long long>(blockIdx.x) * ROWS;
  const long long row = n0 + 16 * warp + r;
  const uint8_t* row0 = w_q + row * w_stride + lane_offset(t);
  const float* w_s_block = w_s + (n0 >> 7) * w_s_stride_n;

  WeightGroup buf[DEPTH];
#pragma unroll
  for (int u = 0; u < DEPTH; ++u) {
    if (u < count) load_group<true>(buf[u], row0, w_stride, first + u, w_s_block, w_s_stride_g);
  }
  float total[32], part[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) total[i] = 0.0f;

  auto group = [&](WeightGroup& grp, int c) {
    uint32_t a[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      a[j][0] = e4m3x2_to_f16x2(grp.w0[j]);
      a[j][1] = e4m3x2_to_f16x2(grp.w1[j]);
      a[j][2] = e4m3x2_to_f16x2(grp.w0[j] >> 16);
      a[j][3] = e4m3x2_to_f16x2(grp.w1[j] >> 16);
    }
    const float w_scale = grp.scale;
    if (c + DEPTH < count) load_group<true>(grp, row0, w_stride, first + c + DEPTH, w_s_block, w_s_stride_g);
    const int slot = c % SLOTS;
    mbar_wait(&ring.full[slot], (c / SLOTS) & 1);
    const uint32_t base = shared_address(ring.tokens[slot]);
    fence_operands(part);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 8; ++j) wgmma_m64n64k16(part, a[j][0], a[j][1], a[j][2], a[j][3], b_descriptor(base + j * STEP_BYTES), j);
    wgmma_commit();
    wgmma_wait_all();
    fence_operands(part);
    const float* scales = ring.scales[slot];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float s0 = scales[8 * j + 2 * t] * w_scale;
      const float s1 = scales[8 * j + 2 * t + 1] * w_scale;
      total[4 * j + 0] += part[4 * j + 0] * s0;
      total[4 * j + 1] += part[4 * j + 1] * s1;
      total[4 * j + 2] += part[4 * j + 2] * s0;
      total[4 * j + 3] += part[4 * j + 3] * s1;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&ring.empty[slot]);
  };
  for (int c0 = 0; c0 < count; c0 += DEPTH) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      if (c0 + u < count) group(buf[u], c0 + u);
    }
  }

  const int splits = static_cast<int>(gridDim.y);
  if (splits > 1) {
    float* mine = scratch + (static_cast<long long>(blockIdx.y) * n_ll + row) * TOKENS;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<float2*>(mine + 8 * j + 2 * t) = make_float2(total[4 * j + 0], total[4 * j + 1]);
      *reinterpret_cast<float2*>(mine + 8 * TOKENS + 8 * j + 2 * t) = make_float2(total[4 * j + 2], total[4 * j + 3]);
    }
    __threadfence();
    sync_threads_named<CONSUMERS>();
    if (threadIdx.x == 0) last_block = atomicAdd(&tile_counters[blockIdx.x], 1) == splits - 1;
    sync_threads_named<CONSUMERS>();
    if (!last_block) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < 32; ++i) total[i] = 0.0f;
    const float* own = scratch + row * TOKENS;
    for (int s = 0; s < splits; ++s) {
      const float* src = own + static_cast<long long>(s) * n_ll * TOKENS;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 lo = __ldcg(reinterpret_cast<const float2*>(src + 8 * j + 2 * t));
        const float2 hi = __ldcg(reinterpret_cast<const float2*>(src + 8 * TOKENS + 8 * j + 2 * t));
        total[4 * j + 0] += lo.x;
        total[4 * j + 1] += lo.y;
        total[4 * j + 2] += hi.x;
        total[4 * j + 3] += hi.y;
      }
    }
    if (threadIdx.x == 0) tile_counters[blockIdx.x] = 0;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
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

}  // namespace

#define QUANTROLL_FP8_WGMMA(WG, DEPTH, MIN_BLOCKS)                                                          \
  extern "C" __global__ void __launch_bounds__(WG * 128, MIN_BLOCKS) fp8_wgmma_wg##WG##_d##DEPTH##_b##MIN_BLOCKS( \
      const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m, long long a_s_stride_g, \
      const uint8_t* w_q, long long w_stride, const float* w_s, long long w_s_stride_n, long long w_s_stride_g, \
      uint16_t* y, long long y_stride, float* scratch, int* tile_counters, long long m_rows, long long n,      \
      long long k, long long per_split) {                                                                   \
    fp8_wgmma<WG, DEPTH>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s, w_s_stride_n,   \
                         w_s_stride_g, y, y_stride, scratch, tile_counters, m_rows, n, k, per_split);       \
  }

// The compiled variants (fp8_wgmma.py's VARIANTS names them): warpgroups per block, weight
// groups in flight per thread, and the blocks per multiprocessor the registers must allow.
QUANTROLL_FP8_WGMMA(1, 2, 3)
QUANTROLL_FP8_WGMMA(1, 3, 3)
QUANTROLL_FP8_WGMMA(1, 4, 2)
QUANTROLL_FP8_WGMMA(2, 2, 1)
QUANTROLL_FP8_WGMMA(2, 3, 1)
QUANTROLL_FP8_WGMMA(2, 4, 1)

#define QUANTROLL_FP8_WGMMA_WS(WG, PW, DEPTH, SLOTS, MIN_BLOCKS)                                            \
  extern "C" __global__ void __launch_bounds__(WG * 128 + PW * 32, MIN_BLOCKS)                              \
      fp8_wgmma_ws_wg##WG##_p##PW##_d##DEPTH##_s##SLOTS##_b##MIN_BLOCKS(                                     \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                 \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                 \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride, float* scratch,  \
          int* tile_counters, long long m_rows, long long n, long long k, long long per_split) {             \
    fp8_wgmma_ws<WG, PW, DEPTH, SLOTS>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, w_s,  \
                                       w_s_stride_n, w_s_stride_g, y, y_stride, scratch, tile_counters,    \
                                       m_rows, n, k, per_split);                                            \
  }

QUANTROLL_FP8_WGMMA_WS(2, 2, 3, 4, 1)
QUANTROLL_FP8_WGMMA_WS(2, 4, 3, 4, 1)
QUANTROLL_FP8_WGMMA_WS(2, 2, 4, 3, 1)
QUANTROLL_FP8_WGMMA_WS(1, 2, 3, 3, 2)
QUANTROLL_FP8_WGMMA_WS(1, 1, 3, 3, 2)
QUANTROLL_FP8_WGMMA_WS(3, 2, 3, 3, 1)

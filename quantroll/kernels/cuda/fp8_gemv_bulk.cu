// The block-FP8 decode GEMM of fp8_gemv.cu (y = (a_q * a_s) @ (w_q * w_s)^T, 1x128
// activation scales, 128x128 weight scales, BF16 out, float32-accurate) with its weight
// bytes brought in by bulk asynchronous copies (the Hopper copy engine, cp.async.bulk)
// instead of per-thread loads into registers. Hopper and newer (sm_90).
//
// Why: at 16 token rows the register kernel holds each K group's weight and token bytes in
// registers while they are in flight; 122 registers per thread allow ~4 blocks of 4 warps
// per multiprocessor, ~30 KB of weight bytes in flight, and gate_up streams at ~60% of the
// DRAM bandwidth (Nsight Compute, 2026-12-01). Bulk copies hold no registers: a producer
// warp keeps STAGES chunks of the block's weight rows in flight in shared memory, and the
// compute warps only read the fragment of the chunk that has landed.
//
// Work and arithmetic are those of fp8_gemv.cu with one row tile (16 weight rows): compute
// warp w takes K groups w, w + WARPS, ...; per group the same exact float16 products and
// float32 sums, scaled and added in group order; the warps' sums added in warp order. So
// the output equals fp8_gemv_mt<MT>_rt1_w<WARPS>_* bit for bit (tests compare the bits).
// Blocks are persistent: block b takes the row tiles b, b + gridDim.x, ..., and the producer
// streams across tile boundaries, so the pipeline fills once per block.
//
// Shared memory, per stage: the 16 weight rows' bytes of WARPS consecutive K groups (one
// chunk), each row padded by 16 bytes so that the fragment reads are free of bank
// conflicts; the token rows' bytes of the same chunk (TOKENS_RESIDENT false) or all of
// them once per block (true: the token codes of all K stay in shared memory, copied once,
// read by every tile). Token rows past the batch are never copied; fragments read the last
// row instead (as fp8_gemv.cu does), and those columns are never stored.
//
// Launch: like fp8_gemv.cu, the producer requests the first STAGES chunks of weights, lets
// the next kernel launch and waits for the previous one (programmatic dependent launch)
// before copying any token bytes; the compute warps wait before reading the scales.

#include "gemv_fragments.cuh"

namespace {

using namespace quantroll_gemv;

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

// Arrive once and add `bytes` to the transfer count the phase waits for.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

// Wait until the phase of parity `parity` has completed.
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

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory
// by the copy engine; completion is counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}

// The compute warps' own barrier (named barrier 1; the producer warp does not take part).
template <int WARPS>
__device__ __forceinline__ void compute_warps_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(WARPS * 32) : "memory");
}

__device__ __forceinline__ Words4 load_shared(const uint8_t* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  return Words4{{v.x, v.y, v.z, v.w}};
}

template <int MT, int WARPS, int STAGES, bool TOKENS_RESIDENT>
struct BulkLayout {
  static constexpr int CHUNK = WARPS * 128;  // K bytes per stage
  static constexpr int ROW = CHUNK + 16;     // padded row of a stage
  static constexpr int TOKEN_ROWS = 8 * MT;
  static constexpr int STAGE_BYTES = (16 + (TOKENS_RESIDENT ? 0 : TOKEN_ROWS)) * ROW;
  // then: resident tokens [TOKEN_ROWS][k + 16], partial sums, barriers
  __host__ __device__ static constexpr long long resident_row(long long k) { return k + 16; }
  __host__ __device__ static constexpr long long bytes(long long k) {
    return STAGES * STAGE_BYTES + (TOKENS_RESIDENT ? TOKEN_ROWS * resident_row(k) : 0) +
           WARPS * 16 * partial_row<MT>() * 4 + (2 * STAGES + 1) * 8;
  }
};

template <int MT, int WARPS, int STAGES, bool TOKENS_RESIDENT>
__device__ __forceinline__ void fp8_gemv_bulk(const uint8_t* a_q, long long a_stride, const float* a_s,
                                              long long a_s_stride_m, long long a_s_stride_g,
                                              const uint8_t* __restrict__ w_q, long long w_stride,
                                              const float* __restrict__ w_s, long long w_s_stride_n,
                                              long long w_s_stride_g, uint16_t* __restrict__ y, long long y_stride,
                                              long long m_rows, long long k, long long n) {
  using L = BulkLayout<MT, WARPS, STAGES, TOKENS_RESIDENT>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* stages = smem;
  uint8_t* tokens = smem + STAGES * L::STAGE_BYTES;  // resident token rows (TOKENS_RESIDENT)
  const long long token_row = L::resident_row(k);
  float(*partial)[16][partial_row<MT>()] = reinterpret_cast<float(*)[16][partial_row<MT>()]>(
      tokens + (TOKENS_RESIDENT ? L::TOKEN_ROWS * token_row : 0));
  uint64_t* full = reinterpret_cast<uint64_t*>(partial + WARPS);
  uint64_t* empty = full + STAGES;
  uint64_t* tokens_landed = empty + STAGES;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = static_cast<int>(k >> 7);
  const int chunks = (groups + WARPS - 1) / WARPS;
  const long long tiles = n >> 4;
  const int my_tiles = static_cast<int>((tiles - blockIdx.x + gridDim.x - 1) / gridDim.x);
  const int last_row = static_cast<int>(m_rows) - 1;
  const int token_rows = min(static_cast<int>(m_rows), L::TOKEN_ROWS);

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], WARPS);
    }
    barrier_init(tokens_landed, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (warp == WARPS) {
    // Producer: stage i of this block is chunk i % chunks of its tile i / chunks.
    const int total = my_tiles * chunks;
    auto chunk_bytes = [&](int c) { return min(WARPS, groups - c * WARPS) * 128; };
    auto copy_weights = [&](int i) {
      const int slot = i % STAGES, c = i % chunks;
      const long long n0 = (blockIdx.x + static_cast<long long>(i / chunks) * gridDim.x) << 4;
      const int bytes = chunk_bytes(c);
      if (lane == 0)
        barrier_expect_bytes(&full[slot], (16 + (TOKENS_RESIDENT ? 0 : token_rows)) * bytes);
      __syncwarp();
      if (lane < 16)
        bulk_copy(stages + slot * L::STAGE_BYTES + lane * L::ROW, w_q + (n0 + lane) * w_stride + c * L::CHUNK, bytes,
                  &full[slot]);
    };
    auto copy_tokens = [&](int i) {  // the chunk's token bytes (per-stage tokens only)
      const int slot = i % STAGES, c = i % chunks;
      if (lane < token_rows)
        bulk_copy(stages + slot * L::STAGE_BYTES + (16 + lane) * L::ROW, a_q + lane * a_stride + c * L::CHUNK,
                  chunk_bytes(c), &full[slot]);
    };
    const int first = min(STAGES, total);
    for (int i = 0; i < first; ++i) copy_weights(i);
    allow_next_grid();
    wait_for_previous_grid();
    if (TOKENS_RESIDENT) {
      if (lane == 0) barrier_expect_bytes(tokens_landed, token_rows * static_cast<uint32_t>(k));
      __syncwarp();
      if (lane < token_rows) bulk_copy(tokens + lane * token_row, a_q + lane * a_stride, k, tokens_landed);
    } else {
      for (int i = 0; i < first; ++i) copy_tokens(i);
    }
    for (int i = STAGES; i < total; ++i) {
      barrier_wait(&empty[i % STAGES], ((i / STAGES) & 1) ^ 1);
      copy_weights(i);
      if (!TOKENS_RESIDENT) copy_tokens(i);
    }
    return;
  }

  // Compute warps.
  allow_next_grid();
  wait_for_previous_grid();
  const int r = lane >> 2, t = lane & 3;
  int scale_rows[MT][2], rows[MT];
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) {
    rows[tile] = min(r + 8 * tile, last_row);
    scale_rows[tile][0] = min(2 * t + 8 * tile, last_row);
    scale_rows[tile][1] = min(2 * t + 1 + 8 * tile, last_row);
  }
  if (TOKENS_RESIDENT) barrier_wait(tokens_landed, 0);
  // Stage i's fragment into registers, then release the stage; the next stage's fragment
  // is fetched before this one multiplies (its shared-memory reads and barrier wait
  // overlap the products).
  auto fetch = [&](int i, Group<MT, 1>& grp) {
    const int slot = i % STAGES, g = (i % chunks) * WARPS + warp;
    const uint8_t* stage = stages + slot * L::STAGE_BYTES;
    barrier_wait(&full[slot], (i / STAGES) & 1);
    if (g < groups) {
      const uint8_t* w0 = stage + r * L::ROW + warp * 128 + lane_offset(t);
      const Words4 p0 = load_shared(w0), p1 = load_shared(w0 + SECOND_PIECE);
      const Words4 p2 = load_shared(w0 + 8 * L::ROW), p3 = load_shared(w0 + 8 * L::ROW + SECOND_PIECE);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        grp.w0[0][q] = p0.w[q];
        grp.w0[0][4 + q] = p1.w[q];
        grp.w1[0][q] = p2.w[q];
        grp.w1[0][4 + q] = p3.w[q];
      }
#pragma unroll
      for (int tile = 0; tile < MT; ++tile) {
        const uint8_t* a = TOKENS_RESIDENT ? tokens + rows[tile] * token_row + (g << 7) + lane_offset(t)
                                           : stage + (16 + rows[tile]) * L::ROW + warp * 128 + lane_offset(t);
        const Words4 v0 = load_shared(a), v1 = load_shared(a + SECOND_PIECE);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          grp.a[tile][q] = v0.w[q];
          grp.a[tile][4 + q] = v1.w[q];
        }
      }
    }
    __syncwarp();
    if (lane == 0) barrier_arrive(&empty[slot]);  // this warp's reads of the stage are done
  };
  const int total_stages = my_tiles * chunks;
  Group<MT, 1> cur;
  fetch(0, cur);
  int i = 0;
  for (int j = 0; j < my_tiles; ++j) {
    const long long n0 = (blockIdx.x + static_cast<long long>(j) * gridDim.x) << 4;
    const float* w_s_block = w_s + (n0 >> 7) * w_s_stride_n;
    float total[1][MT][4];
    zero(total);
    for (int c = 0; c < chunks; ++c, ++i) {
      const int g = c * WARPS + warp;
      Group<MT, 1> nxt;
      if (i + 1 < total_stages) fetch(i + 1, nxt);
      if (g < groups) {
        float acc[1][MT][4];
        multiply_group<MT, 1>(cur, acc);
        add_scaled<MT, 1>(total, acc, a_s, scale_rows, a_s_stride_m, a_s_stride_g, g, w_s_block[g * w_s_stride_g]);
      }
      cur = nxt;
    }
    // The warps' sums in warp order, as reduce_and_store (which syncs all threads) does.
#pragma unroll
    for (int tile = 0; tile < MT; ++tile) {
      const int m = 2 * t + 8 * tile;
      partial[warp][r][m] = total[0][tile][0];
      partial[warp][r][m + 1] = total[0][tile][1];
      partial[warp][r + 8][m] = total[0][tile][2];
      partial[warp][r + 8][m + 1] = total[0][tile][3];
    }
    compute_warps_sync<WARPS>();
    for (int idx = threadIdx.x; idx < 16 * 8 * MT; idx += WARPS * 32) {
      const int row = idx % 16, m = idx / 16;
      if (m <= last_row) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) sum += partial[w][row][m];
        y[m * y_stride + n0 + row] = f32_to_bf16_rne(sum);
      }
    }
    compute_warps_sync<WARPS>();  // partial is rewritten by the next tile
  }
}

}  // namespace

#define QUANTROLL_FP8_GEMV_BULK(MT, WARPS, STAGES, RESIDENT)                                                   \
  extern "C" __global__ void __launch_bounds__((WARPS + 1) * 32)                                               \
      fp8_gemv_bulk_mt##MT##_w##WARPS##_s##STAGES##_r##RESIDENT(                                               \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                    \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                    \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride,                     \
          long long m_rows, long long k, long long n) {                                                        \
    fp8_gemv_bulk<MT, WARPS, STAGES, RESIDENT>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, \
                                               w_s, w_s_stride_n, w_s_stride_g, y, y_stride, m_rows, k, n);   \
  }

// The compiled variants (fp8_gemv_bulk.py's VARIANTS names them; bench/gemv_bulk.py times them).
QUANTROLL_FP8_GEMV_BULK(1, 4, 4, 0)
QUANTROLL_FP8_GEMV_BULK(1, 8, 2, 0)
QUANTROLL_FP8_GEMV_BULK(1, 8, 3, 0)
QUANTROLL_FP8_GEMV_BULK(1, 8, 4, 0)
QUANTROLL_FP8_GEMV_BULK(2, 4, 2, 0)
QUANTROLL_FP8_GEMV_BULK(2, 4, 3, 0)
QUANTROLL_FP8_GEMV_BULK(2, 8, 2, 0)
QUANTROLL_FP8_GEMV_BULK(2, 8, 3, 0)
QUANTROLL_FP8_GEMV_BULK(2, 16, 2, 0)
QUANTROLL_FP8_GEMV_BULK(2, 4, 2, 1)
QUANTROLL_FP8_GEMV_BULK(2, 8, 2, 1)
QUANTROLL_FP8_GEMV_BULK(2, 4, 4, 1)

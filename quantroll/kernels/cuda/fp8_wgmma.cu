// Block-FP8 decode GEMM for 17-64 token rows on Hopper's warpgroup MMA (sm_90a):
// y = (a_q * a_s) @ (w_q * w_s)^T, 1x128 activation scales, 128x128 weight scales, BF16
// output, float32-accurate (exact float16 products of the codes, float32 sums).
//
// Why: at 64 token rows mma.sync (fp8_gemv.cu, Triton's decode kernel) must fetch every
// token fragment from shared memory or L1 once per 16 weight rows, and issue slots and
// shared-memory bandwidth, not the weight bytes, set the pace (Triton: ~104 us per Qwen3-8B
// layer set for ~45 us of bytes). wgmma reads the token operand (B) from shared memory
// itself, once per warpgroup instruction for 64 weight rows, and takes the weight operand
// (A) from registers, so the FP8 weights are still streamed with 16-byte loads straight
// into registers and widened there (e4m3 -> float16 is exact), never staged.
//
// This design: every thread multiplies and also stages tokens. A block of WG warpgroups
// owns 64 * WG weight rows and the K groups [first, first + per_split) of split
// blockIdx.y; warp w holds rows 16 w + {r, r + 8} (r = lane / 4). Per group: group c + 2's
// token codes are requested by cp.async (each thread its own pieces, so no barrier before
// it widens them), group c + 1's are widened into the other tile slot while group c's 8
// wgmma run, and partial * (token scale x weight scale) is added to the float32 total;
// one block barrier per group. Weight bytes are requested DEPTH groups ahead.
// wgmma_fragments.cuh has the layouts; fp8_wgmma_ws.cu is the warp-specialized twin.
//
// Launch: the first DEPTH groups of weight bytes are requested before waiting for the
// previous kernel (programmatic dependent launch, as fp8_gemv.cu), tokens only after.

#include "wgmma_fragments.cuh"

namespace {

using namespace quantroll_wgmma;

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

constexpr int RAW_SLOTS = 3;  // groups c (scales in use), c + 1 (landing), c + 2 (requested)

template <int N>
struct Shared {
  uint8_t tokens[2][slot_bytes<N>()];     // widened tiles; group c in slot c % 2
  uint8_t raw[RAW_SLOTS][pieces<N>()][16];  // codes as copied, by piece; group c in slot c % 3
  float scales[RAW_SLOTS][N];             // token scales of the same groups
};

// Request group g's token codes (this thread's pieces p = threadIdx.x + i * THREADS) and
// scales into raw slot ``slot``: one commit group.
template <int N, int THREADS>
__device__ __forceinline__ void request_tokens(Shared<N>& sh, int slot, const GemmArgs& args, int g) {
  const int m_rows = static_cast<int>(args.m_rows);
#pragma unroll
  for (int p = threadIdx.x; p < pieces<N>(); p += THREADS) {
    const Piece pc(p);
    const bool real = pc.n < m_rows;
    copy_async_16(sh.raw[slot][p], args.token_group(real ? pc.n : 0, g) + pc.byte(), real ? 16 : 0);
  }
  if (threadIdx.x < N) {
    const int n = threadIdx.x;
    const bool real = n < m_rows;
    copy_async_4(&sh.scales[slot][n], args.token_scale(real ? n : 0, g), real ? 4 : 0);
  }
  copy_async_commit();
}

// Widen this thread's pieces of raw slot ``raw`` into tile ``dst`` (its own copies, landed:
// no barrier before; one after).
template <int N, int THREADS>
__device__ __forceinline__ void widen_tokens(Shared<N>& sh, int raw, int dst) {
#pragma unroll
  for (int p = threadIdx.x; p < pieces<N>(); p += THREADS) {
    widen_piece<N>(sh.tokens[dst], Piece(p), *reinterpret_cast<const uint4*>(sh.raw[raw][p]));
  }
}

template <int N, int WG, int DEPTH>
__device__ __forceinline__ void fp8_wgmma(GemmArgs args) {
  constexpr int THREADS = 128 * WG;
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  Shared<N>& sh = *reinterpret_cast<Shared<N>*>(shared_bytes);
  __shared__ int last_block;
  const WeightSide at(args, 64 * WG);
  const int count = at.count;

  WeightGroup buf[DEPTH];
#pragma unroll
  for (int u = 0; u < DEPTH; ++u) {
    if (u < count) at.load<true>(buf[u], u);
  }
  allow_next_grid();
  wait_for_previous_grid();
  args.a_q = after_wait(args.a_q);

  request_tokens<N, THREADS>(sh, 0, args, at.first);
  if (count > 1) request_tokens<N, THREADS>(sh, 1, args, at.first + 1);
  else copy_async_commit();
  copy_async_wait<1>();
  widen_tokens<N, THREADS>(sh, 0, 0);
  fence_async_shared();
  __syncthreads();

  float total[N / 2], part[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) total[i] = 0.0f;

  // Group c (tile c % 2, raw slot c % 3) from grp, whose registers then take group c + DEPTH.
  auto group = [&](WeightGroup& grp, int c) {
    if (c + 2 < count) {
      request_tokens<N, THREADS>(sh, (c + 2) % RAW_SLOTS, args, at.first + c + 2);
    } else {
      copy_async_commit();  // an empty group keeps the wait counts uniform
    }
    uint32_t a[8][4];
    to_fragments(grp, a);
    const float w_scale = grp.scale;
    if (c + DEPTH < count) at.load<true>(grp, c + DEPTH);
    issue_group<N>(a, shared_address(sh.tokens[c & 1]), part);
    if (c + 1 < count) {
      copy_async_wait<1>();  // group c + 1's codes (this thread's pieces) have landed
      widen_tokens<N, THREADS>(sh, (c + 1) % RAW_SLOTS, (c + 1) & 1);
    }
    wgmma_wait_all();
    add_scaled<N>(total, part, sh.scales[c % RAW_SLOTS], w_scale, at.t);
    fence_async_shared();
    __syncthreads();  // group c + 1's tile is written and visible; tile c % 2 is free again
  };
  for (int c0 = 0; c0 < count; c0 += DEPTH) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      if (c0 + u < count) group(buf[u], c0 + u);
    }
  }
  copy_async_wait<0>();
  finish<N>(total, at, args, last_block, [] { __syncthreads(); });
}

}  // namespace

#define QUANTROLL_FP8_WGMMA(N, WG, DEPTH, MIN_BLOCKS)                                                      \
  extern "C" __global__ void __launch_bounds__(WG * 128, MIN_BLOCKS)                                        \
      fp8_wgmma_n##N##_wg##WG##_d##DEPTH##_b##MIN_BLOCKS(QUANTROLL_WGMMA_PARAMS) {                           \
    fp8_wgmma<N, WG, DEPTH>(QUANTROLL_WGMMA_ARGS);                                                          \
  }

// The compiled variants (fp8_wgmma.py's VARIANTS names them): token rows of the tile,
// warpgroups per block, weight groups in flight per thread, and the blocks per
// multiprocessor the registers must allow. The 64-row ones were measured (2026-12-01).
QUANTROLL_FP8_WGMMA(64, 1, 2, 3)
QUANTROLL_FP8_WGMMA(64, 1, 3, 3)
QUANTROLL_FP8_WGMMA(64, 1, 4, 2)
QUANTROLL_FP8_WGMMA(64, 2, 2, 1)
QUANTROLL_FP8_WGMMA(64, 2, 3, 1)
QUANTROLL_FP8_WGMMA(64, 2, 4, 1)
QUANTROLL_FP8_WGMMA(32, 1, 3, 3)
QUANTROLL_FP8_WGMMA(16, 1, 2, 4)
QUANTROLL_FP8_WGMMA(16, 1, 3, 3)
QUANTROLL_FP8_WGMMA(16, 1, 4, 3)
QUANTROLL_FP8_WGMMA(16, 2, 3, 1)

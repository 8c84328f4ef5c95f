// The warp-specialized twin of fp8_wgmma.cu (same contract, same layouts, same sums in the
// same order): PW producer warps load the token codes into registers one group ahead and
// widen them into a ring of SLOTS tiles; WG consumer warpgroups stream the weights (DEPTH
// groups ahead, in registers) and multiply. Hand-offs go through mbarriers, per slot: full
// (the PW * 32 producer threads have written it) and empty (every consumer warp's wgmma
// has read it), so no warp ever waits on a block-wide barrier and the tile a group needs is
// usually written before the consumers reach it.
//
// Why: fp8_wgmma.cu (every thread stages and multiplies, one barrier per group) measured
// 122 us per Qwen3-8B layer set at 64 rows against Triton's 105 (H200, 2026-12-01), with
// Nsight Compute showing the L1/shared-memory pipe as the busiest unit (77%): per 8 KB of
// weights a 64-row block moved 48 KB through shared memory (8 KB of codes copied in, read
// back, 16 KB widened out, 16 KB read by wgmma). Here the codes skip shared memory
// (loaded into the producers' registers) and a block of two consumer warpgroups shares
// each widened tile: 48 KB per 16 KB of weights.
//
// Only the producers wait for the previous kernel (programmatic dependent launch); the
// consumers' first weight loads go out at once and every later read or write of theirs
// follows a full-barrier wait, hence that kernel's end. PRODUCER_REGS / CONSUMER_REGS
// (setmaxnreg, whole producer warpgroup only): move registers from the producers to the
// consumers.

#include "wgmma_fragments.cuh"

namespace {

using namespace quantroll_wgmma;

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}
// Wait until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

template <int N, int SLOTS>
struct Ring {
  uint8_t tokens[SLOTS][slot_bytes<N>()];
  float scales[SLOTS][N];
  uint64_t full[SLOTS];
  uint64_t empty[SLOTS];
};

// A producer thread's pieces of one group (p = ptid + i * PRODUCERS) and the scale of
// token ptid (ptid < N).
template <int PP>
struct ProducerPieces {
  uint4 v[PP];
  float scale;
};

template <int N, int PP, int PRODUCERS>
__device__ __forceinline__ void producer_load(ProducerPieces<PP>& pc, int ptid, const uint8_t* a_q, long long a_stride,
                                              const float* a_s, long long a_s_stride_m, long long a_s_stride_g,
                                              int m_rows, int g) {
#pragma unroll
  for (int i = 0; i < PP; ++i) {
    const Piece piece(ptid + i * PRODUCERS);
    if (piece.n < m_rows) {
      const Words4 w = load_cached(a_q + piece.n * a_stride + (static_cast<long long>(g) << 7) + piece.byte());
      pc.v[i] = make_uint4(w.w[0], w.w[1], w.w[2], w.w[3]);
    } else {
      pc.v[i] = make_uint4(0, 0, 0, 0);
    }
  }
  pc.scale = ptid < m_rows && ptid < N ? a_s[ptid * a_s_stride_m + g * a_s_stride_g] : 0.0f;
}

template <int N, int WG, int PW, int DEPTH, int SLOTS, int PRODUCER_REGS, int CONSUMER_REGS>
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
  constexpr int PP = pieces<N>() / PRODUCERS;
  static_assert(pieces<N>() % PRODUCERS == 0 && PRODUCERS >= N, "producers: whole pieces, one scale per token");
  static_assert(!PRODUCER_REGS || PW == 4, "setmaxnreg needs the producers to be one whole warpgroup");
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  Ring<N, SLOTS>& ring = *reinterpret_cast<Ring<N, SLOTS>*>(shared_bytes);
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

  if (threadIdx.x >= CONSUMERS) {  // producers: group c into slot c % SLOTS, its (c / SLOTS)-th use
    if (PRODUCER_REGS) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
    const int ptid = threadIdx.x - CONSUMERS;
    wait_for_previous_grid();
    a_q = after_wait(a_q);
    ProducerPieces<PP> pa, pb;
    producer_load<N, PP, PRODUCERS>(pa, ptid, a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, m_rows, first);
    auto produce = [&](const ProducerPieces<PP>& cur, ProducerPieces<PP>& nxt, int c) {
      if (c + 1 < count) {
        producer_load<N, PP, PRODUCERS>(nxt, ptid, a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, m_rows, first + c + 1);
      }
      const int slot = c % SLOTS;
      if (c >= SLOTS) mbar_wait(&ring.empty[slot], ((c / SLOTS) + 1) & 1);  // its previous use is read
#pragma unroll
      for (int i = 0; i < PP; ++i) widen_piece<N>(ring.tokens[slot], Piece(ptid + i * PRODUCERS), cur.v[i]);
      if (ptid < N) ring.scales[slot][ptid] = cur.scale;
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

  if (CONSUMER_REGS) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
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
  float total[N / 2], part[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) total[i] = 0.0f;

  auto group = [&](WeightGroup& grp, int c) {
    uint32_t a[8][4];
    to_fragments(grp, a);
    const float w_scale = grp.scale;
    if (c + DEPTH < count) load_group<true>(grp, row0, w_stride, first + c + DEPTH, w_s_block, w_s_stride_g);
    const int slot = c % SLOTS;
    mbar_wait(&ring.full[slot], (c / SLOTS) & 1);
    issue_group<N>(a, shared_address(ring.tokens[slot]), part);
    wgmma_wait_all();
    add_scaled<N>(total, part, ring.scales[slot], w_scale, t);
    __syncwarp();
    if (lane == 0) mbar_arrive(&ring.empty[slot]);
  };
  for (int c0 = 0; c0 < count; c0 += DEPTH) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      if (c0 + u < count) group(buf[u], c0 + u);
    }
  }
  finish<N>(total, row, t, m_rows, n_ll, y, y_stride, scratch, tile_counters, last_block,
         [] { asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory"); });
}

}  // namespace

#define QUANTROLL_FP8_WGMMA_WS(N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS, PREGS, CREGS)                           \
  extern "C" __global__ void __launch_bounds__(WG * 128 + PW * 32, MIN_BLOCKS)                              \
      fp8_wgmma_ws_n##N##_wg##WG##_p##PW##_d##DEPTH##_s##SLOTS##_b##MIN_BLOCKS##_r##CREGS(                   \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                 \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                 \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride, float* scratch,  \
          int* tile_counters, long long m_rows, long long n, long long k, long long per_split) {             \
    fp8_wgmma_ws<N, WG, PW, DEPTH, SLOTS, PREGS, CREGS>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, \
                                                        w_stride, w_s, w_s_stride_n, w_s_stride_g, y,       \
                                                        y_stride, scratch, tile_counters, m_rows, n, k,     \
                                                        per_split);                                         \
  }

// The compiled variants (fp8_wgmma.py's VARIANTS names them): token rows of the tile,
// consumer warpgroups, producer warps, weight groups in flight, ring slots, blocks per
// multiprocessor, and the register split (0: none; else producers drop to PREGS and
// consumers rise to CREGS).
QUANTROLL_FP8_WGMMA_WS(64, 2, 2, 3, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(64, 2, 2, 2, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(64, 2, 4, 3, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(64, 2, 4, 4, 4, 1, 40, 232)
QUANTROLL_FP8_WGMMA_WS(64, 1, 2, 3, 3, 2, 0, 0)
QUANTROLL_FP8_WGMMA_WS(64, 1, 2, 2, 4, 2, 0, 0)
QUANTROLL_FP8_WGMMA_WS(32, 2, 2, 3, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(16, 2, 1, 3, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(16, 2, 1, 4, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(16, 1, 1, 4, 4, 2, 0, 0)

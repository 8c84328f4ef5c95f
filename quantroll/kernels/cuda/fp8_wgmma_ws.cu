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
__device__ __forceinline__ void producer_load(ProducerPieces<PP>& pc, int ptid, const GemmArgs& args, int g) {
  const int m_rows = static_cast<int>(args.m_rows);
#pragma unroll
  for (int i = 0; i < PP; ++i) {
    const Piece piece(ptid + i * PRODUCERS);
    if (piece.n < m_rows) {
      const Words4 w = load_cached(args.token_group(piece.n, g) + piece.byte());
      pc.v[i] = make_uint4(w.w[0], w.w[1], w.w[2], w.w[3]);
    } else {
      pc.v[i] = make_uint4(0, 0, 0, 0);
    }
  }
  pc.scale = ptid < m_rows && ptid < N ? *args.token_scale(ptid, g) : 0.0f;
}

template <int N, int WG, int PW, int DEPTH, int SLOTS, int PRODUCER_REGS, int CONSUMER_REGS>
__device__ __forceinline__ void fp8_wgmma_ws(GemmArgs args) {
  constexpr int CONSUMERS = 128 * WG;
  constexpr int PRODUCERS = 32 * PW;
  constexpr int PP = pieces<N>() / PRODUCERS;
  static_assert(pieces<N>() % PRODUCERS == 0 && PRODUCERS >= N, "producers: whole pieces, one scale per token");
  static_assert(!PRODUCER_REGS || PW == 4, "setmaxnreg needs the producers to be one whole warpgroup");
  // setmaxnreg.inc waits until the block's pool holds the registers asked for: the
  // producers must release at least what the consumers take, or the kernel hangs. ptxas
  // gives every thread the launch bound's share (65536 / threads, a multiple of 8).
  constexpr int LAUNCH_REGS = (65536 / (CONSUMERS + PRODUCERS)) & ~7;
  static_assert((PRODUCER_REGS == 0) == (CONSUMER_REGS == 0), "setmaxnreg: both sides or neither");
  static_assert((CONSUMER_REGS - LAUNCH_REGS) * CONSUMERS <= (LAUNCH_REGS - PRODUCER_REGS) * PRODUCERS,
                "setmaxnreg: the consumers would take more registers than the producers release");
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  Ring<N, SLOTS>& ring = *reinterpret_cast<Ring<N, SLOTS>*>(shared_bytes);
  __shared__ int last_block;

  const WeightSide at(args, 64 * WG);  // the producers use only first and count
  const int first = at.first, count = at.count;
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
    args.a_q = after_wait(args.a_q);
    ProducerPieces<PP> pa, pb;
    producer_load<N, PP, PRODUCERS>(pa, ptid, args, first);
    auto produce = [&](const ProducerPieces<PP>& cur, ProducerPieces<PP>& nxt, int c) {
      if (c + 1 < count) producer_load<N, PP, PRODUCERS>(nxt, ptid, args, first + c + 1);
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
  WeightGroup buf[DEPTH];
#pragma unroll
  for (int u = 0; u < DEPTH; ++u) {
    if (u < count) at.load<true>(buf[u], u);
  }
  float total[N / 2], part[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) total[i] = 0.0f;

  auto group = [&](WeightGroup& grp, int c) {
    uint32_t a[8][4];
    to_fragments(grp, a);
    const float w_scale = grp.scale;
    if (c + DEPTH < count) at.load<true>(grp, c + DEPTH);
    const int slot = c % SLOTS;
    mbar_wait(&ring.full[slot], (c / SLOTS) & 1);
    issue_group<N>(a, shared_address(ring.tokens[slot]), part);
    wgmma_wait_all();
    add_scaled<N>(total, part, ring.scales[slot], w_scale, at.t);
    __syncwarp();
    if (at.lane == 0) mbar_arrive(&ring.empty[slot]);
  };
  for (int c0 = 0; c0 < count; c0 += DEPTH) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      if (c0 + u < count) group(buf[u], c0 + u);
    }
  }
  finish<N>(total, at, args, last_block, [] { asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory"); });
}

}  // namespace

#define QUANTROLL_FP8_WGMMA_WS(N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS, PREGS, CREGS)                           \
  extern "C" __global__ void __launch_bounds__(WG * 128 + PW * 32, MIN_BLOCKS)                              \
      fp8_wgmma_ws_n##N##_wg##WG##_p##PW##_d##DEPTH##_s##SLOTS##_b##MIN_BLOCKS##_r##CREGS(                   \
          QUANTROLL_WGMMA_PARAMS) {                                                                         \
    fp8_wgmma_ws<N, WG, PW, DEPTH, SLOTS, PREGS, CREGS>(QUANTROLL_WGMMA_ARGS);                              \
  }

// The compiled variants (fp8_wgmma.py's VARIANTS names them): token rows of the tile,
// consumer warpgroups, producer warps, weight groups in flight, ring slots, blocks per
// multiprocessor, and the register split (0: none; else producers drop to PREGS and
// consumers rise to CREGS; at 40 / 232 the producers spilled in their loop).
QUANTROLL_FP8_WGMMA_WS(64, 2, 2, 3, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(64, 2, 2, 2, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(64, 2, 4, 3, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(64, 2, 4, 4, 4, 1, 56, 224)
QUANTROLL_FP8_WGMMA_WS(64, 1, 2, 3, 3, 2, 0, 0)
QUANTROLL_FP8_WGMMA_WS(64, 1, 2, 2, 4, 2, 0, 0)
QUANTROLL_FP8_WGMMA_WS(32, 2, 2, 3, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(16, 2, 1, 3, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(16, 2, 1, 4, 4, 1, 0, 0)
QUANTROLL_FP8_WGMMA_WS(16, 1, 1, 4, 4, 2, 0, 0)

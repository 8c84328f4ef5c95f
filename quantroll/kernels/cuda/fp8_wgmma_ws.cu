// Block-FP8 decode GEMM for up to 64 token rows on Hopper's warpgroup MMA (sm_90a), warp-
// specialized: y = (a_q * a_s) @ (w_q * w_s)^T, 1x128 activation scales, 128x128 weight
// scales, BF16 output, float32-accurate (exact float16 products of the codes, float32
// sums). wgmma reads the token operand (B) from shared memory itself, once per warpgroup
// instruction for 64 weight rows, and takes the weight operand (A) from registers, so the
// FP8 weights are streamed with 16-byte loads straight into registers and widened there
// (e4m3 -> float16 is exact); the layouts are in wgmma_fragments.cuh. PW producer warps
// load the token codes into registers one group ahead and widen them into a ring of SLOTS
// tiles; WG consumer warpgroups stream the weights (DEPTH groups ahead) and multiply. Hand-offs go through mbarriers, per slot: full
// (the PW * 32 producer threads have written it) and empty (every consumer warp's wgmma
// has read it), so no warp ever waits on a block-wide barrier and the tile a group needs is
// usually written before the consumers reach it.
//
// History (docs/PERFORMANCE.md, session 11): a first design in which every thread staged
// tokens and multiplied, with a block barrier per group, measured 122 us per Qwen3-8B
// layer set at 64 rows (Triton 105) and lost to this one at every width; removed.
//
// Only the producers wait for the previous kernel (programmatic dependent launch); the
// consumers' first weight loads go out at once and every later read or write of theirs
// follows a full-barrier wait, hence that kernel's end. (A variant moving registers from
// producers to consumers with setmaxnreg was measured no faster and removed.)

#include <type_traits>

#include "silu_quant.cuh"
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

// A compile-time group parity (which of PIPE's two buffers a group uses).
template <int B>
struct Parity {
  static constexpr int value = B;
};

template <int N, int SLOTS>
struct Ring {
  uint8_t tokens[SLOTS][slot_bytes<N>()];
  float scales[SLOTS][N];
  uint64_t full[SLOTS];
  uint64_t empty[SLOTS];
};

// What the producers put into a tile, from where: two sources with one interface (load a
// group into registers, then store it into a tile and its scales).

// The token codes and scales the previous kernel quantized: PP pieces per thread (piece
// p = ptid + i * PRODUCERS), and the scale of token ptid.
template <int N, int PRODUCERS>
struct CodeSource {
  static constexpr int PP = pieces<N>() / PRODUCERS;
  static_assert(pieces<N>() % PRODUCERS == 0 && PRODUCERS >= N, "producers: whole pieces, one scale per token");
  struct Loaded {
    uint4 v[PP];
    float scale;
  };

  __device__ __forceinline__ static void load(Loaded& l, int ptid, const GemmArgs& args, int g) {
    const int m_rows = static_cast<int>(args.m_rows);
#pragma unroll
    for (int i = 0; i < PP; ++i) {
      const Piece piece(ptid + i * PRODUCERS);
      if (piece.n < m_rows) {
        const Words4 w = load_cached(args.token_group(piece.n, g) + piece.byte());
        l.v[i] = make_uint4(w.w[0], w.w[1], w.w[2], w.w[3]);
      } else {
        l.v[i] = make_uint4(0, 0, 0, 0);
      }
    }
    l.scale = ptid < m_rows && ptid < N ? *args.token_scale(ptid, g) : 0.0f;
  }

  __device__ __forceinline__ static void store(const Loaded& l, int ptid, uint8_t* tile, float* scales) {
#pragma unroll
    for (int i = 0; i < PP; ++i) widen_piece<N>(tile, Piece(ptid + i * PRODUCERS), l.v[i]);
    if (ptid < N) scales[ptid] = l.scale;
  }
};

// silu(gate) * up of a BF16 gate_up [M, 2 I] (the gate_up GEMM's output), quantized here as
// the silu kernel would have (silu_quant.cuh), so that kernel is not launched. Thread ptid
// holds, per i, quarter t = q % 4 of token q / 4's group (q = ptid + i * PRODUCERS: 32
// values, two pieces); the four lanes holding a token's quarters exchange their largest
// |value| for the group's scale. A warp's stores hit 32 banks, as CodeSource's.
template <int N, int PRODUCERS>
struct SiluSource {
  static constexpr int PQ = N * 4 / PRODUCERS;
  static_assert((N * 4) % PRODUCERS == 0, "producers: whole quarters");
  struct Loaded {
    uint4 gate[PQ][4];
    uint4 up[PQ][4];
  };

  __device__ __forceinline__ static void load(Loaded& l, int ptid, const GemmArgs& args, int g) {
    const int m_rows = static_cast<int>(args.m_rows);
#pragma unroll
    for (int i = 0; i < PQ; ++i) {
      const int q = ptid + i * PRODUCERS, n = q >> 2, t = q & 3;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (n < m_rows) {
          const uint8_t* gate = args.a_q + n * args.a_stride + ((static_cast<long long>(g) << 7) + 32 * t) * 2 + 16 * j;
          const Words4 gw = load_cached(gate);
          const Words4 uw = load_cached(gate + args.silu_inter * 2);
          l.gate[i][j] = make_uint4(gw.w[0], gw.w[1], gw.w[2], gw.w[3]);
          l.up[i][j] = make_uint4(uw.w[0], uw.w[1], uw.w[2], uw.w[3]);
        } else {  // silu(0) * 0 = 0: zero codes, zero scale
          l.gate[i][j] = l.up[i][j] = make_uint4(0, 0, 0, 0);
        }
      }
    }
  }

  __device__ __forceinline__ static void store(const Loaded& l, int ptid, uint8_t* tile, float* scales) {
    using namespace quantroll_silu;
#pragma unroll
    for (int i = 0; i < PQ; ++i) {
      const int q = ptid + i * PRODUCERS, n = q >> 2, t = q & 3;
      float y[32];
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t gw[4] = {l.gate[i][j].x, l.gate[i][j].y, l.gate[i][j].z, l.gate[i][j].w};
        const uint32_t uw[4] = {l.up[i][j].x, l.up[i][j].y, l.up[i][j].z, l.up[i][j].w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          y[8 * j + 2 * w] = silu_mul(bf16_bits_to_f32(gw[w] & 0xFFFF), bf16_bits_to_f32(uw[w] & 0xFFFF));
          y[8 * j + 2 * w + 1] = silu_mul(bf16_bits_to_f32(gw[w] >> 16), bf16_bits_to_f32(uw[w] >> 16));
        }
      }
#pragma unroll
      for (int e = 0; e < 32; ++e) amax = fmaxf(amax, fabsf(y[e]));
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
      const float scale = group_scale(amax);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t words[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float* v = y + 16 * half + 4 * w;
          words[w] = quantize_pair(v[0], v[1], scale) | (quantize_pair(v[2], v[3], scale) << 16);
        }
        const int p = 64 * (n >> 3) + 32 * half + 4 * (n & 7) + t;  // Piece(p) is (n, t, half)
        widen_piece<N>(tile, Piece(p), make_uint4(words[0], words[1], words[2], words[3]));
      }
      if (t == 0) scales[n] = scale;
    }
  }
};

template <int N, int WG, int PW, int DEPTH, int SLOTS, bool SILU, bool PIPE>
__device__ __forceinline__ void fp8_wgmma_ws(GemmArgs args) {
  constexpr int CONSUMERS = 128 * WG;
  constexpr int PRODUCERS = 32 * PW;
  using Source = std::conditional_t<SILU, SiluSource<N, PRODUCERS>, CodeSource<N, PRODUCERS>>;
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
    const int ptid = threadIdx.x - CONSUMERS;
    wait_for_previous_grid();
    args.a_q = after_wait(args.a_q);
    typename Source::Loaded pa, pb;
    Source::load(pa, ptid, args, first);
    auto produce = [&](const typename Source::Loaded& cur, typename Source::Loaded& nxt, int c) {
      if (c + 1 < count) Source::load(nxt, ptid, args, first + c + 1);
      const int slot = c % SLOTS;
      if (c >= SLOTS) mbar_wait(&ring.empty[slot], ((c / SLOTS) + 1) & 1);  // its previous use is read
      Source::store(cur, ptid, ring.tokens[slot], ring.scales[slot]);
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

  WeightGroup buf[DEPTH];
#pragma unroll
  for (int u = 0; u < DEPTH; ++u) {
    if (u < count) at.load<true>(buf[u], u);
  }
  float total[N / 2], part[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) total[i] = 0.0f;

  // Group c's partial sums into total, then its slot back to the producers.
  auto retire = [&](float (&p)[N / 2], int c, float w_scale) {
    const int slot = c % SLOTS;
    add_scaled<N>(total, p, ring.scales[slot], w_scale, at.t);
    __syncwarp();
    if (at.lane == 0) mbar_arrive(&ring.empty[slot]);
  };
  if constexpr (!PIPE) {
    auto group = [&](WeightGroup& grp, int c) {
      uint32_t a[8][4];
      to_fragments(grp, a);
      const float w_scale = grp.scale;
      if (c + DEPTH < count) at.load<true>(grp, c + DEPTH);
      const int slot = c % SLOTS;
      mbar_wait(&ring.full[slot], (c / SLOTS) & 1);
      issue_group<N>(a, shared_address(ring.tokens[slot]), part);
      wgmma_wait_all();
      retire(part, c, w_scale);
    };
    for (int c0 = 0; c0 < count; c0 += DEPTH) {
#pragma unroll
      for (int u = 0; u < DEPTH; ++u) {
        if (c0 + u < count) group(buf[u], c0 + u);
      }
    }
  } else {
    // PIPE: two partial accumulators and two sets of A fragments, so that group c's 8
    // wgmma are queued while group c - 1's still run (a chain of 8 dependent wgmma per
    // group, waited for at once, left the tensor pipe idle between groups: 2026-12-01).
    static_assert(DEPTH % 2 == 0, "PIPE alternates buffers by group parity: DEPTH must be even");
    float part2[2][N / 2];
    uint32_t a2[2][8][4];
    float w_scales[2];
    auto group = [&](WeightGroup& grp, int c, auto parity) {  // Parity<c % 2>
      constexpr int b = decltype(parity)::value;
      to_fragments(grp, a2[b]);
      w_scales[b] = grp.scale;
      if (c + DEPTH < count) at.load<true>(grp, c + DEPTH);
      const int slot = c % SLOTS;
      mbar_wait(&ring.full[slot], (c / SLOTS) & 1);
      issue_group<N>(a2[b], shared_address(ring.tokens[slot]), part2[b]);
      if (c > 0) {
        wgmma_wait_one();  // group c - 1 is done
        retire(part2[1 - b], c - 1, w_scales[1 - b]);
      }
    };
    for (int c0 = 0; c0 < count; c0 += DEPTH) {
#pragma unroll
      for (int u = 0; u < DEPTH; ++u) {
        if (c0 + u < count) {
          if (u % 2 == 0) group(buf[u], c0 + u, Parity<0>{});
          else group(buf[u], c0 + u, Parity<1>{});
        }
      }
    }
    wgmma_wait_all();
    if ((count - 1) % 2 == 0) retire(part2[0], count - 1, w_scales[0]);
    else retire(part2[1], count - 1, w_scales[1]);
  }
  finish<N>(total, at, args, last_block, [] { asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory"); });
}

}  // namespace

#define QUANTROLL_FP8_WGMMA_WS_KERNEL(NAME, N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS, SILU, PIPE)                 \
  extern "C" __global__ void __launch_bounds__(WG * 128 + PW * 32, MIN_BLOCKS) NAME(QUANTROLL_WGMMA_PARAMS) {  \
    fp8_wgmma_ws<N, WG, PW, DEPTH, SLOTS, SILU, PIPE>(QUANTROLL_WGMMA_ARGS);                                \
  }
#define QUANTROLL_FP8_WGMMA_WS(N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS)                                         \
  QUANTROLL_FP8_WGMMA_WS_KERNEL(fp8_wgmma_ws_n##N##_wg##WG##_p##PW##_d##DEPTH##_s##SLOTS##_b##MIN_BLOCKS,    \
                                N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS, false, false)
// The down_proj twins that compute silu(gate) * up of a BF16 gate_up themselves (SiluSource).
#define QUANTROLL_FP8_WGMMA_WS_SILU(N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS)                                    \
  QUANTROLL_FP8_WGMMA_WS_KERNEL(fp8_wgmma_ws_silu_n##N##_wg##WG##_p##PW##_d##DEPTH##_s##SLOTS##_b##MIN_BLOCKS, \
                                N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS, true, false)
// Consumers with two wgmma groups in flight (PIPE).
#define QUANTROLL_FP8_WGMMA_WS_PIPE(N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS)                                    \
  QUANTROLL_FP8_WGMMA_WS_KERNEL(fp8_wgmma_ws_pipe_n##N##_wg##WG##_p##PW##_d##DEPTH##_s##SLOTS##_b##MIN_BLOCKS, \
                                N, WG, PW, DEPTH, SLOTS, MIN_BLOCKS, false, true)

// The compiled variants (fp8_wgmma.py's VARIANTS names them): token rows of the tile,
// consumer warpgroups, producer warps, weight groups in flight, ring slots, blocks per
// multiprocessor.
QUANTROLL_FP8_WGMMA_WS(64, 2, 2, 3, 4, 1)
QUANTROLL_FP8_WGMMA_WS(64, 2, 2, 2, 4, 1)
QUANTROLL_FP8_WGMMA_WS(64, 2, 4, 3, 4, 1)
QUANTROLL_FP8_WGMMA_WS(64, 1, 2, 3, 3, 2)
QUANTROLL_FP8_WGMMA_WS(64, 1, 2, 2, 4, 2)
QUANTROLL_FP8_WGMMA_WS(32, 2, 2, 3, 4, 1)
QUANTROLL_FP8_WGMMA_WS(16, 2, 1, 3, 4, 1)
QUANTROLL_FP8_WGMMA_WS(16, 2, 1, 4, 4, 1)
QUANTROLL_FP8_WGMMA_WS(16, 1, 1, 4, 4, 2)
// The SiluSource twins (64-row tiles left out: two quarters per producer thread spilled).
QUANTROLL_FP8_WGMMA_WS_SILU(32, 2, 4, 3, 4, 1)
QUANTROLL_FP8_WGMMA_WS_SILU(16, 2, 2, 3, 4, 1)
QUANTROLL_FP8_WGMMA_WS_SILU(16, 1, 2, 4, 4, 2)
QUANTROLL_FP8_WGMMA_WS_PIPE(16, 1, 1, 4, 4, 2)
QUANTROLL_FP8_WGMMA_WS_PIPE(16, 2, 1, 4, 4, 1)
QUANTROLL_FP8_WGMMA_WS_PIPE(16, 1, 1, 2, 4, 3)
QUANTROLL_FP8_WGMMA_WS_PIPE(16, 1, 1, 2, 4, 4)
QUANTROLL_FP8_WGMMA_WS_PIPE(16, 1, 1, 2, 3, 4)
QUANTROLL_FP8_WGMMA_WS_PIPE(32, 1, 1, 2, 4, 3)
QUANTROLL_FP8_WGMMA_WS_PIPE(64, 1, 2, 2, 3, 2)
QUANTROLL_FP8_WGMMA_WS_PIPE(32, 2, 2, 2, 4, 1)
QUANTROLL_FP8_WGMMA_WS_PIPE(64, 2, 4, 2, 4, 1)
QUANTROLL_FP8_WGMMA_WS_PIPE(64, 1, 2, 2, 4, 1)

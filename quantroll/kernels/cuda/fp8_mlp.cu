// A block-FP8 MLP for decode batches (M <= 16) in two kernels whose work overlaps:
// y = down(q(bf16(silu(gate)) * up)), gate | up = x @ gate_up^T, q the 1x128 FP8
// quantization of down's input. The same bits as fp8_gemv's gate_up GEMM, the silu * up
// kernel and fp8_gemv's down GEMM run one after the other (tests/kernels/test_fp8_mlp.py).
//
// Why: between the gate_up and down GEMMs of the unfused step sit gate_up's last wave, in
// which most multiprocessors stream nothing, and the silu kernel (~2.4 us per layer on
// the critical path at 16 rows, docs/PERFORMANCE.md session 10). Here the down kernel is
// launched early behind the gate/up kernel and starts streaming its weights as soon as
// multiprocessors free up; it waits per 128-wide K group, not for the whole grid, for a
// flag that says the group's input is ready.
//
// fp8_gate_up_silu: a block owns 8 * RT intermediate columns j0..: its 16-row mma tile rt
// holds gate rows j0 + 8 rt + {0..7} over the matching up rows (2I x H weight, gate rows
// first), so one thread's sums are gate and up of the same column. After the block's
// reduction it writes h = bf16(silu(gate)) * up (BF16, to a scratch) and counts itself in
// at its 128-column group; the block that completes a group quantizes it (per token row:
// amax, scale, e4m3 codes, silu_quant.cuh's arithmetic) and sets the group's flag.
//
// fp8_down_after_flags: fp8_gemv's loop, the token codes and scales of each K group read
// (from L2: the L1 is not coherent with the other kernel's writes) only after that group's
// flag; its last block to finish zeroes the counters for the next launch.
//
// Counters (int32, zero between launches): [0] down blocks finished, [1, 1 + G) blocks
// arrived per group, [1 + G, 1 + 2 G) ready flags, G = I / 128.
//
// No deadlock: the down kernel is launched with programmatic dependent launch, and its
// blocks start only once every gate/up block has started (each releases it at its
// start); gate/up blocks wait for nothing but the kernel before them. Launched plainly,
// the down kernel starts after the gate/up kernel has finished and finds every flag set.

#include "gemv_loop.cuh"
#include "silu_quant.cuh"

namespace {

using namespace quantroll_gemv;

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// 16 bytes from L2 (ld.global.cg), ordered after the volatile asms before it (the flag).
__device__ __forceinline__ Words4 load_l2(const void* p) {
  Words4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p));
  return v;
}

__device__ __forceinline__ float load_l2_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// Token codes and scales of a K group written by the gate/up kernel, which may still run:
// read once the group's flag is set.
struct AfterGroupFlags {
  const int* ready;
  __device__ __forceinline__ void start() const { allow_next_grid(); }
  __device__ __forceinline__ void before_group(int g) const {
    while (load_acquire(ready + g) == 0) __nanosleep(64);
  }
  __device__ __forceinline__ Words4 tokens(const uint8_t* p) const { return load_l2(p); }
  __device__ __forceinline__ float scale(const float* p) const { return load_l2_f32(p); }
};

// Quantize K group g of h [rows, I] (BF16) into codes and scales: 8 threads per token row,
// 16 values each; amax over the row's group by shuffles within the 8 lanes. Threads past
// the 8 * 8 * MT that take part return at once (whole warps).
template <int MT>
__device__ __forceinline__ void quantize_group(const uint16_t* h, long long h_stride, uint8_t* q, long long q_stride,
                                               float* s, long long s_stride_m, long long s_stride_g, int g,
                                               int last_row) {
  using namespace quantroll_silu;
  const int i = threadIdx.x;
  if (i >= 64 * MT) return;
  const int m = i >> 3, seg = i & 7;
  const bool row = m <= last_row;
  const long long col = (static_cast<long long>(g) << 7) + 16 * seg;
  float v[16];
  float amax = 0.0f;
  if (row) {
    const Words4 lo = load_l2(h + m * h_stride + col);
    const Words4 hi = load_l2(h + m * h_stride + col + 8);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      v[2 * w] = bf16_bits_to_f32(lo.w[w] & 0xFFFF);
      v[2 * w + 1] = bf16_bits_to_f32(lo.w[w] >> 16);
      v[8 + 2 * w] = bf16_bits_to_f32(hi.w[w] & 0xFFFF);
      v[8 + 2 * w + 1] = bf16_bits_to_f32(hi.w[w] >> 16);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] = 0.0f;
  }
#pragma unroll
  for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(v[e]));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 4));
  if (!row) return;
  const float scale = group_scale(amax);
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float* p = v + 4 * w;
    words[w] = quantize_pair(p[0], p[1], scale) | (quantize_pair(p[2], p[3], scale) << 16);
  }
  *reinterpret_cast<uint4*>(q + m * q_stride + col) = make_uint4(words[0], words[1], words[2], words[3]);
  if (seg == 0) s[m * s_stride_m + g * s_stride_g] = scale;
}

template <int MT, int RT, int WARPS, int UNROLL, bool PIPELINE>
__device__ __forceinline__ void gate_up_silu(const uint8_t* a_q, long long a_stride, const float* a_s,
                                             long long a_s_stride_m, long long a_s_stride_g,
                                             const uint8_t* __restrict__ w_q, long long w_stride,
                                             const float* __restrict__ w_s, long long w_s_stride_n,
                                             long long w_s_stride_g, uint16_t* h, long long h_stride, uint8_t* q,
                                             long long q_stride, float* s, long long s_stride_m, long long s_stride_g,
                                             int* counters, long long m_rows, long long k, long long inter) {
  constexpr int COLS = 8 * RT;  // intermediate columns of the block
  constexpr int ROWS = 16 * RT;  // partial-sum rows: per tile 8 gate rows, then their 8 up rows
  constexpr int THREADS = 32 * WARPS;
  __shared__ float partial[WARPS][ROWS][partial_row<MT>()];
  __shared__ int completes_group;

  Place<MT> at(COLS, w_q, w_stride, a_q, a_stride, m_rows, k);
  const long long j0 = at.n0;
  const RowPlan plan{at.w_row0, 8 * w_stride, inter * w_stride, w_s + (j0 >> 7) * w_s_stride_n,
                     w_s + ((inter + j0) >> 7) * w_s_stride_n, w_s_stride_g};
  float total[RT][MT][4];
  gemv_totals<MT, RT, WARPS, UNROLL, PIPELINE>(total, plan, AfterPreviousGrid{}, at, a_s, a_s_stride_m, a_s_stride_g);

  write_partial<MT, RT, ROWS>(partial[at.warp], 0, total);
  __syncthreads();
  for (int idx = threadIdx.x; idx < COLS * 8 * MT; idx += THREADS) {
    const int n = idx % COLS, m = idx / COLS;
    if (m <= at.last_row) {
      const int gate_row = 16 * (n >> 3) + (n & 7);
      float gate = 0.0f, up = 0.0f;  // summed in warp order, as sum_partials_and_store does
#pragma unroll
      for (int w = 0; w < WARPS; ++w) gate += partial[w][gate_row][m];
#pragma unroll
      for (int w = 0; w < WARPS; ++w) up += partial[w][gate_row + 8][m];
      const float act = quantroll_silu::silu_mul(quantroll_silu::round_bf16(gate), quantroll_silu::round_bf16(up));
      h[m * h_stride + j0 + n] = f32_to_bf16_rne(act);  // act is a BF16 value already
    }
  }

  // Count the block in at its group; the last of the group's 128 / COLS blocks quantizes it.
  const int g = static_cast<int>(j0 >> 7);
  const int groups = static_cast<int>(inter >> 7);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) completes_group = atomicAdd(counters + 1 + g, 1) == 128 / COLS - 1;
  __syncthreads();
  if (!completes_group) return;
  __threadfence();
  quantize_group<MT>(h, h_stride, q, q_stride, s, s_stride_m, s_stride_g, g, at.last_row);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) store_release(counters + 1 + groups + g, 1);
}

template <int MT, int RT, int WARPS, int UNROLL, bool PIPELINE>
__device__ __forceinline__ void down_after_flags(const uint8_t* a_q, long long a_stride, const float* a_s,
                                                 long long a_s_stride_m, long long a_s_stride_g,
                                                 const uint8_t* __restrict__ w_q, long long w_stride,
                                                 const float* __restrict__ w_s, long long w_s_stride_n,
                                                 long long w_s_stride_g, uint16_t* __restrict__ y, long long y_stride,
                                                 int* counters, long long m_rows, long long k) {
  constexpr int ROWS = 16 * RT;
  __shared__ float partial[WARPS][ROWS][partial_row<MT>()];

  Place<MT> at(ROWS, w_q, w_stride, a_q, a_stride, m_rows, k);
  const float* w_s_block = w_s + (at.n0 >> 7) * w_s_stride_n;
  const RowPlan plan{at.w_row0, 16 * w_stride, 8 * w_stride, w_s_block, w_s_block, w_s_stride_g};
  const int groups = at.groups;
  float total[RT][MT][4];
  gemv_totals<MT, RT, WARPS, UNROLL, PIPELINE>(total, plan, AfterGroupFlags{counters + 1 + groups}, at, a_s,
                                               a_s_stride_m, a_s_stride_g);
  reduce_and_store<MT, RT, WARPS>(partial, total, y, y_stride, at.n0, at.last_row);

  // Every flag this block reads has been read (the reduction's barrier). The gate/up
  // kernel is done too (it set every flag; wait for its exit all the same); the last block
  // to finish zeroes the counters for the next launch.
  wait_for_previous_grid();
  if (threadIdx.x == 0 && atomicAdd(counters, 1) == static_cast<int>(gridDim.x) - 1) {
    for (int i = 1; i < 1 + 2 * groups; ++i) counters[i] = 0;
    counters[0] = 0;
  }
}

}  // namespace

#define QUANTROLL_FP8_GATE_UP_SILU(MT, RT, WARPS, UNROLL, PIPELINE)                                           \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                    \
      fp8_gate_up_silu_mt##MT##_rt##RT##_w##WARPS##_u##UNROLL##_p##PIPELINE(                                  \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                   \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                   \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* h, long long h_stride, uint8_t* q,        \
          long long q_stride, float* s, long long s_stride_m, long long s_stride_g, int* counters,            \
          long long m_rows, long long k, long long inter) {                                                   \
    gate_up_silu<MT, RT, WARPS, UNROLL, PIPELINE>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q, w_stride, \
                                                  w_s, w_s_stride_n, w_s_stride_g, h, h_stride, q, q_stride, s, \
                                                  s_stride_m, s_stride_g, counters, m_rows, k, inter);        \
  }

#define QUANTROLL_FP8_DOWN_AFTER_FLAGS(MT, RT, WARPS, UNROLL, PIPELINE)                                       \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                    \
      fp8_down_after_flags_mt##MT##_rt##RT##_w##WARPS##_u##UNROLL##_p##PIPELINE(                              \
          const uint8_t* a_q, long long a_stride, const float* a_s, long long a_s_stride_m,                   \
          long long a_s_stride_g, const uint8_t* w_q, long long w_stride, const float* w_s,                   \
          long long w_s_stride_n, long long w_s_stride_g, uint16_t* y, long long y_stride, int* counters,     \
          long long m_rows, long long k) {                                                                    \
    down_after_flags<MT, RT, WARPS, UNROLL, PIPELINE>(a_q, a_stride, a_s, a_s_stride_m, a_s_stride_g, w_q,     \
                                                      w_stride, w_s, w_s_stride_n, w_s_stride_g, y, y_stride, \
                                                      counters, m_rows, k);                                   \
  }

// fp8_mlp.py's GATE_UP_VARIANTS and DOWN_VARIANTS name these (a test keeps them equal):
// fp8_gemv's choices for both width classes at 1-8 and 9-16 rows (the same warps, hence
// the same bits as the unfused GEMMs: 8B's gate_up is wide, its down narrow; a hidden
// size above 4096 makes down wide), and a few neighbours for the sweep.
QUANTROLL_FP8_GATE_UP_SILU(1, 2, 8, 1, 1)
QUANTROLL_FP8_GATE_UP_SILU(2, 1, 4, 1, 1)
QUANTROLL_FP8_GATE_UP_SILU(2, 2, 4, 1, 1)
QUANTROLL_FP8_GATE_UP_SILU(2, 1, 8, 1, 1)
QUANTROLL_FP8_GATE_UP_SILU(1, 1, 8, 1, 1)
QUANTROLL_FP8_DOWN_AFTER_FLAGS(2, 1, 8, 1, 1)
QUANTROLL_FP8_DOWN_AFTER_FLAGS(1, 2, 8, 1, 1)
QUANTROLL_FP8_DOWN_AFTER_FLAGS(1, 1, 8, 1, 1)
QUANTROLL_FP8_DOWN_AFTER_FLAGS(2, 1, 4, 1, 1)

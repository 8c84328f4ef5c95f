// Paged decode attention over an FP8 (E4M3) KV cache: one query token per sequence, the
// query heads of one KV head (a GQA group of at most 16) on the 16 rows of mma.sync.
//
// Why CUDA and not Triton: the Triton kernel (paged_attention_triton.py) reads an FP8 cache
// at 1.22-1.32x its bytes' time where a BF16 cache reads at 1.0x. Compiled, its 128-key FP8
// tile takes twice the instructions per byte of the BF16 tile (a register -> shared ->
// register round trip of every widened operand, 12 barriers). Here each lane reads the E4M3
// codes it multiplies, in 16- or 8-byte words, from a shared-memory stage that cp.async
// filled, widens them to float16 (exact) in the registers mma.sync reads, and no operand is
// rearranged after that: the order of a dot product's terms is free, so the keys and dims
// each lane holds are chosen to be contiguous bytes of the cache as it is laid out.
//
// Cache layout (engine/paged_cache.py, FP8): keys [blocks, 16, HKV, 128] (a key's 128 dims
// contiguous), values [blocks, HKV, 128, 16] (a block's 16 positions of one dim contiguous),
// scales [blocks, HKV, 16] float32 per position and KV head for keys and for values.
//
// Work: block (sequence b, KV head, split) of WARPS warps; the split's keys in chunks of 32
// (two cache blocks), chunk c to warp c % WARPS. Per chunk a warp computes
//   S = Q K^T (M = 16 head rows, N = 32 keys in 4 n-tiles, K = 128 dims in 8 steps) and
//   O += P V (M = 16, N = 128 dims in 16 n-tiles, K = 32 keys in 2 steps),
// with lane (r, t) = (lane / 4, lane % 4):
//   - dims: mma K step j takes dims 32t + 4j + {0, 1} in A/B slots (2t, 2t + 1) and
//     32t + 4j + {2, 3} in slots (2t + 8, 2t + 9): a lane's 32 contiguous bytes of a key;
//   - keys: lane t's keys are block t / 2 of the chunk, positions 8 (t % 2) + 0..7. S's
//     n-tile 2s + h, column 2t + i holds position 8 (t % 2) + 4s + 2h + i, so the S fragment
//     a lane holds is the P fragment (A operand) of the P V step s, and the value bytes it
//     multiplies, positions 8 (t % 2) + 4s + 0..3 of one dim, are one 4-byte word.
// Scales: a key's scale multiplies its column of S; a value's scale, divided by `unit` (the
// power of two at or above the largest value scale so far, so P stays in [0, 1] where
// float16 is fine), its column of P; the accumulator is kept in units of `unit` and rescaled
// only when the running max or `unit` changes.
// Softmax in float32 and base 2 (ex2.approx, as Triton's exp), the running sum per lane,
// summed at the end. The WARPS partial results meet in shared memory. With SPLITS > 1 each
// block writes (O / l, m, l) per head (m in natural-log units, as the Triton decode kernel
// writes it) for paged_attention_triton.merge_splits_kernel. With one split: the output,
// BF16, or (`codes` not null) its E4M3 codes and per-head scale for a block-FP8 o_proj, bit
// for bit what act_quant_fp8_kernel makes of that BF16 output.
// Why the merge is a second launch: merging in the kernel (the last split of a sequence to
// finish, counted on an atomic) cost the one-split launches 6-9% (H100, 2026-12-06, the same
// machine: its code raised the kernel to 189 registers, and capped at 168 the main loop was
// scheduled worse) and won nothing at 16 x 2048 (37.8 us against 33.8 with the merge launch).

#include "gemv_fragments.cuh"
#include "paged_decode_stage.cuh"
#include "paged_decode_epilogue.cuh"

namespace {

using namespace quantroll_gemv;
using namespace quantroll_paged;

// One warp's running state: o holds the attention-weighted values (not yet divided by the
// softmax sum) divided by `unit`, the power of two at or above the largest value scale seen
// (0 before any), so that P' = p * value scale / unit stays in [0, 1] where float16 is fine,
// and o is rescaled only when the running max or `unit` changes; m, l: running max (base 2)
// and this lane's part of the running sum of rows r and r + 8.
struct Accumulator {
  float o[16][4];
  float m[2];
  float l[2];
  float unit;
  __device__ __forceinline__ Accumulator() : m{-INFINITY, -INFINITY}, l{0.0f, 0.0f}, unit(0.0f) {
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  }
};

// The power of two at or above x > 0 (a normal float32).
__device__ __forceinline__ float pow2_at_least(float x) {
  return __uint_as_float((__float_as_uint(x) + 0x007fffffu) & 0xff800000u);
}

// One chunk of 32 keys from its shared-memory stage into `acc`. FULL: every key of the chunk
// is in the split (no masking).
template <bool FULL>
__device__ __forceinline__ void chunk_step(Accumulator& acc, const uint32_t (&qa)[8][4], const char* stage, int first,
                                           int end, int r, int t, float scale2) {
  const int block_of_t = t >> 1, pos0 = 8 * (t & 1);  // lane t's keys: block t / 2, positions pos0 + 0..7
  const int first_of_t = first + block_of_t * BLOCK + pos0;
  const float* scales = reinterpret_cast<const float*>(stage + KEY_STAGE + VALUE_STAGE);
  float ks[8], vs[8];
  {
    const float4* kq = reinterpret_cast<const float4*>(scales + block_of_t * BLOCK + pos0);
    const float4* vq = reinterpret_cast<const float4*>(scales + (2 + block_of_t) * BLOCK + pos0);
    const float4 k0 = kq[0], k1 = kq[1], v0 = vq[0], v1 = vq[1];
    const float kk[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
    const float vv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      ks[i] = kk[i] * scale2;
      vs[i] = FULL || first_of_t + i < end ? vv[i] : 0.0f;  // a stale scale past the sequence may be NaN
    }
  }
  // S = Q K^T: n-tile 2s + h; lane (r, t) supplies key column r: block r / 4, position
  // 8 ((r / 2) % 2) + 4s + 2h + r % 2, its bytes 32t .. 32t + 31.
  float s[4][4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int key_row = (r >> 2) * BLOCK + 8 * ((r >> 1) & 1) + 4 * (nt >> 1) + 2 * (nt & 1) + (r & 1);
    const uint4 w0 = *reinterpret_cast<const uint4*>(stage + key_piece(key_row, 2 * t));
    const uint4 w1 = *reinterpret_cast<const uint4*>(stage + key_piece(key_row, 2 * t + 1));
    const uint32_t words[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t b0, b1;
      widen4(words[j], b0, b1);
      mma_16816(s[nt], qa[j][0], qa[j][1], qa[j][2], qa[j][3], b0, b1);
    }
  }
  // lane (r, t) holds S rows r (s[.][0..1]) and r + 8 (s[.][2..3]); column 2t + i of n-tile
  // 2s + h is its key pos0 + 4s + 2h + i
  float rowmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = 4 * (nt >> 1) + 2 * (nt & 1) + (e & 1);
      s[nt][e] = FULL || first_of_t + k < end ? s[nt][e] * ks[k] : -INFINITY;
      rowmax[e >> 1] = fmaxf(rowmax[e >> 1], s[nt][e]);
    }
  }
  float top = fmaxf(fmaxf(fmaxf(vs[0], vs[1]), fmaxf(vs[2], vs[3])), fmaxf(fmaxf(vs[4], vs[5]), fmaxf(vs[6], vs[7])));
#pragma unroll
  for (int x = 1; x < 32; x <<= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, x));
  const float unit = top > acc.unit ? pow2_at_least(top) : acc.unit;
  const float to_unit = unit > 0.0f ? 1.0f / unit : 0.0f;  // exact: a power of two (0: no value yet)
  float rescale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rowmax[h] = fmaxf(rowmax[h], __shfl_xor_sync(0xffffffffu, rowmax[h], 1));
    rowmax[h] = fmaxf(rowmax[h], __shfl_xor_sync(0xffffffffu, rowmax[h], 2));
    const float m_new = fmaxf(acc.m[h], rowmax[h]);
    const float alpha = m_new == -INFINITY ? 1.0f : ex2(acc.m[h] - m_new);
    acc.m[h] = m_new;
    acc.l[h] *= alpha;
    rescale[h] = alpha * (acc.unit * to_unit);
  }
  acc.unit = unit;
  uint32_t pa[2][4];  // P' = p * value scale / unit: A fragments of the two key steps
#pragma unroll
  for (int st = 0; st < 2; ++st) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mm = acc.m[e >> 1];
        const float pe = mm == -INFINITY ? 0.0f : ex2(s[2 * st + h][e] - mm);
        acc.l[e >> 1] += pe;
        p[e] = pe * (vs[4 * st + 2 * h + (e & 1)] * to_unit);
      }
      pa[st][h * 2] = pack_f16x2(p[0], p[1]);      // a0 / a2: row r, slots (2t, 2t+1) / (2t+8, 2t+9)
      pa[st][h * 2 + 1] = pack_f16x2(p[2], p[3]);  // a1 / a3: row r + 8
    }
  }
  if (!__all_sync(0xffffffffu, rescale[0] == 1.0f && rescale[1] == 1.0f)) {  // most chunks: the max held
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      acc.o[n][0] *= rescale[0];
      acc.o[n][1] *= rescale[0];
      acc.o[n][2] *= rescale[1];
      acc.o[n][3] *= rescale[1];
    }
  }
  const char* values = stage + KEY_STAGE + block_of_t * VALUE_PAGE + pos0;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const uint2 w = *reinterpret_cast<const uint2*>(values + (8 * n + r) * BLOCK);  // dim 8n + r
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      uint32_t b0, b1;
      widen4(st ? w.y : w.x, b0, b1);  // positions pos0 + 4 st + 0..3
      mma_16816(acc.o[n], pa[st][0], pa[st][1], pa[st][2], pa[st][3], b0, b1);
    }
  }
}

template <int WARPS>
__device__ __forceinline__ void decode(const uint16_t* __restrict__ q, long long s_qb, long long s_qh,
                                       const uint8_t* __restrict__ k_pool, const uint8_t* __restrict__ v_pool,
                                       const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                                       const int* __restrict__ tables, long long s_tb,
                                       const int* __restrict__ lengths, uint16_t* __restrict__ out, long long s_ob,
                                       long long s_oh, float* __restrict__ part_o, float* __restrict__ part_ml,
                                       long long hkv, long long group, long long splits, uint8_t* __restrict__ codes,
                                       float* __restrict__ code_scales, long long s_cb, long long s_csg) {
  extern __shared__ __align__(16) char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, t = lane & 3;
  const long long b = blockIdx.x;
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int length = lengths[b];
  const int per_split = ((length + splits - 1) / splits + CHUNK - 1) / CHUNK * CHUNK;
  const int start = split * per_split;
  const int end = min(start + per_split, length);
  const int* table_row = tables + b * s_tb;
  const int g = static_cast<int>(group), heads = static_cast<int>(hkv * group);

  // Q rows r and r + 8 of the group (zeros past it), float16, A fragments of the 8 dim steps.
  uint32_t qa[8][4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = r + 8 * half;
    const uint16_t* src = q + b * s_qb + (static_cast<long long>(kvh) * g + min(row, g - 1)) * s_qh + 32 * t;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = row < g ? bf16_to_f32(src[4 * j + i]) : 0.0f;
      qa[j][half] = pack_f16x2(x[0], x[1]);      // slots (2t, 2t + 1): dims 32t + 4j + {0, 1}
      qa[j][half + 2] = pack_f16x2(x[2], x[3]);  // slots (2t + 8, 2t + 9): dims 32t + 4j + {2, 3}
    }
  }
  const float scale2 = rsqrtf(static_cast<float>(D)) * LOG2E;

  Accumulator acc;

  char* stages = smem + warp * 2 * STAGE;
  const int chunks = end > start ? (end - start + CHUNK - 1) / CHUNK : 0;
  int c = warp;
  if (c < chunks) load_chunk(stages, chunk_at(table_row, start + c * CHUNK, length), k_pool, v_pool, k_scale,
                             v_scale, kvh, static_cast<int>(hkv), lane);
  cp_async_commit();
  for (int it = 0; c < chunks; c += WARPS, ++it) {
    const int next = c + WARPS;
    if (next < chunks) load_chunk(stages + ((it + 1) & 1) * STAGE, chunk_at(table_row, start + next * CHUNK, length),
                                  k_pool, v_pool, k_scale, v_scale, kvh, static_cast<int>(hkv), lane);
    cp_async_commit();
    cp_async_wait<1>();
    __syncwarp();
    const char* stage = stages + (it & 1) * STAGE;
    const int first = start + c * CHUNK;
    if (first + CHUNK <= end) {
      chunk_step<true>(acc, qa, stage, first, end, r, t, scale2);
    } else {
      chunk_step<false>(acc, qa, stage, first, end, r, t, scale2);
    }
    __syncwarp();  // the stage is refilled two chunks on
  }
  cp_async_wait<0>();
  __syncthreads();

  // The warps' (m, l, o * unit) meet in shared memory (the stages are free now).
  float* red_o = reinterpret_cast<float*>(smem);                // [WARPS][16][D]
  float* red_ml = red_o + WARPS * 16 * D;                        // [WARPS][16][2]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    acc.l[h] += __shfl_xor_sync(0xffffffffu, acc.l[h], 1);
    acc.l[h] += __shfl_xor_sync(0xffffffffu, acc.l[h], 2);
  }
#pragma unroll
  for (int n = 0; n < 16; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = r + 8 * (e >> 1), col = 8 * n + 2 * t + (e & 1);
      red_o[(warp * 16 + row) * D + col] = acc.o[n][e] * acc.unit;
    }
  }
  if (t == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      red_ml[(warp * 16 + r + 8 * h) * 2] = acc.m[h];
      red_ml[(warp * 16 + r + 8 * h) * 2 + 1] = acc.l[h];
    }
  }
  __syncthreads();
  // (sum of the warps' weighted values, their softmax sum, the max) of head `row`, dim `col`
  auto combined = [&](int row, int col, float& l_all, float& m_all) {
    m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) m_all = fmaxf(m_all, red_ml[(w * 16 + row) * 2]);
    float sum = 0.0f;
    l_all = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float mw = red_ml[(w * 16 + row) * 2];
      const float f = mw == -INFINITY ? 0.0f : ex2(mw - m_all);
      l_all += red_ml[(w * 16 + row) * 2 + 1] * f;
      sum += red_o[(w * 16 + row) * D + col] * f;
    }
    return sum;
  };
  if (splits > 1) {  // this split's partials [B, H, SPLITS, D] and [B, H, SPLITS, 2]; an empty split stores l = 0
    for (int idx = threadIdx.x; idx < g * D; idx += WARPS * 32) {
      const int row = idx / D, col = idx % D;
      float l_all, m_all;
      const float acc = combined(row, col, l_all, m_all);
      const long long at = (b * heads + static_cast<long long>(kvh) * g + row) * splits + split;
      part_o[at * D + col] = l_all > 0.0f ? acc / l_all : 0.0f;
      if (col == 0) {
        part_ml[at * 2] = m_all * LN2;  // natural-log units
        part_ml[at * 2 + 1] = l_all;
      }
    }
    return;
  }
  emit<WARPS>([&](int row, int col) {
    float l_all, m_all;
    const float acc = combined(row, col, l_all, m_all);
    return acc / l_all;
  }, g, kvh, b, lane, warp, red_ml + WARPS * 16 * 2, out, s_ob, s_oh, codes, code_scales, s_cb, s_csg);
}

}  // namespace

// Shared memory: 2 stages of STAGE bytes per warp (the reduction reuses them).
#define QUANTROLL_PAGED_DECODE_FP8(WARPS)                                                                       \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) paged_decode_fp8_w##WARPS(                          \
      const uint16_t* q, long long s_qb, long long s_qh, const uint8_t* k_pool, const uint8_t* v_pool,         \
      const float* k_scale, const float* v_scale, const int* tables, long long s_tb, const int* lengths,       \
      uint16_t* out, long long s_ob, long long s_oh, float* part_o, float* part_ml, long long hkv,             \
      long long group, long long splits, uint8_t* codes, float* code_scales, long long s_cb, long long s_csg) { \
    decode<WARPS>(q, s_qb, s_qh, k_pool, v_pool, k_scale, v_scale, tables, s_tb, lengths, out, s_ob, s_oh,     \
                  part_o, part_ml, hkv, group, splits, codes, code_scales, s_cb, s_csg);                       \
  }

QUANTROLL_PAGED_DECODE_FP8(4)
QUANTROLL_PAGED_DECODE_FP8(2)

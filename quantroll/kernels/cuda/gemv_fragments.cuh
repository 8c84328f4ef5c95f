// Building blocks of the decode GEMM kernels in fp8_gemv.cu: loads, conversions, the
// mma.sync wrapper, a thread's fragment of one K group, programmatic dependent launch,
// and the block's final reduction. fp8_gemv.cu says how the work is
// laid out; everything here is per thread and pure.

#pragma once

#include <stdint.h>

namespace quantroll_gemv {

struct Words4 {
  uint32_t w[4];
};

// Weights are read once: keep them out of L1. PINNED: volatile, so that the compiler keeps
// the load before wait_for_previous_grid (the prologue's prefetch).
template <bool PINNED>
__device__ __forceinline__ Words4 load_stream(const uint8_t* p) {
  Words4 v;
  if (PINNED) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
                 : "l"(p));
  } else {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
        : "l"(p));
  }
  return v;
}

// Token codes are read by every block: plain (coherent, L1-cached) loads, not the
// non-coherent .nc path, whose contract (data read-only for the kernel's lifetime) an early
// launch breaks: the previous kernel writes them while this one already runs. Not
// volatile (the compiler may schedule it freely); its address comes from after_wait,
// which keeps it after the wait.
__device__ __forceinline__ Words4 load_cached(const uint8_t* p) {
  Words4 v;
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
      : "l"(p));
  return v;
}

// Where a lane's two 16-byte pieces of a row's 128-byte group sit: bytes 32t and 32t + 16
// (each load instruction of a lane quad then uses half of four 32-byte sectors; a layout
// reading whole sectors, 16t and 64 + 16t, measured the same on the H200, 2026-12-01).
__device__ __forceinline__ int lane_offset(int t) { return 32 * t; }
constexpr int SECOND_PIECE = 16;

// Two e4m3 codes (low byte first) to two float16 values: exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair) {
  uint32_t out;
  uint16_t in = static_cast<uint16_t>(pair);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(in));
  return out;
}

// D += A B on the tensor cores: float16 pairs, float32 accumulation.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint16_t f32_to_bf16_rne(float x) {
  uint16_t out;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out) : "f"(x));
  return out;
}

template <int RT, int MT>
__device__ __forceinline__ void zero(float (&sums)[RT][MT][4]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int tile = 0; tile < MT; ++tile) {
#pragma unroll
      for (int i = 0; i < 4; ++i) sums[rt][tile][i] = 0.0f;
    }
  }
}

// Where one thread of a block of ROWS weight rows works: its lane and warp, fragment row r
// and column pair t, the block's first weight row n0, the K groups, the last token row;
// its weight row, and per token tile its token row and the two token rows whose scales it
// applies (rows past the batch clamp to the last one: loaded, never stored).
template <int MT>
struct Place {
  int lane, warp, r, t, groups, last_row;
  long long n0;
  const uint8_t* w_row0;
  const uint8_t* a_rows[MT];
  int scale_rows[MT][2];

  __device__ __forceinline__ Place(int rows, const uint8_t* w_q, long long w_stride, const uint8_t* a_q,
                                   long long a_stride, long long m_rows, long long k) {
    lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
    r = lane >> 2;
    t = lane & 3;
    n0 = static_cast<long long>(blockIdx.x) * rows;
    groups = static_cast<int>(k >> 7);
    last_row = static_cast<int>(m_rows) - 1;
    w_row0 = w_q + (n0 + r) * w_stride + lane_offset(t);
#pragma unroll
    for (int tile = 0; tile < MT; ++tile) {
      a_rows[tile] = a_q + min(r + 8 * tile, last_row) * a_stride + lane_offset(t);
      scale_rows[tile][0] = min(2 * t + 8 * tile, last_row);
      scale_rows[tile][1] = min(2 * t + 1 + 8 * tile, last_row);
    }
  }
};

// One 128-wide K group of one thread: for each of its RT 16-row weight tiles, rows r and
// r + 8 (8 words each), and for each of its MT token tiles, the 8 words of token row r.
template <int MT, int RT>
struct Group {
  uint32_t w0[RT][8];
  uint32_t w1[RT][8];
  uint32_t a[MT][8];
};

// The 8 words of one weight row: its two 16-byte pieces.
template <bool PINNED>
__device__ __forceinline__ void load_row(uint32_t (&words)[8], const uint8_t* row) {
  const Words4 first = load_stream<PINNED>(row);
  const Words4 second = load_stream<PINNED>(row + SECOND_PIECE);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    words[i] = first.w[i];
    words[4 + i] = second.w[i];
  }
}

template <int MT, int RT, bool PINNED>
__device__ __forceinline__ void load_weights(Group<MT, RT>& grp, const uint8_t* w_row0, long long w_stride,
                                             long long offset) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const uint8_t* row0 = w_row0 + 16 * rt * w_stride + offset;
    const uint8_t* row1 = row0 + 8 * w_stride;
    load_row<PINNED>(grp.w0[rt], row0);
    load_row<PINNED>(grp.w1[rt], row1);
  }
}

template <int MT, int RT>
__device__ __forceinline__ void load_tokens(Group<MT, RT>& grp, const uint8_t* const (&a_rows)[MT], long long offset) {
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) {
    Words4 v = load_cached(a_rows[tile] + offset);
#pragma unroll
    for (int i = 0; i < 4; ++i) grp.a[tile][i] = v.w[i];
    v = load_cached(a_rows[tile] + offset + SECOND_PIECE);
#pragma unroll
    for (int i = 0; i < 4; ++i) grp.a[tile][4 + i] = v.w[i];
  }
}

// Programmatic dependent launch: when this grid was launched early (fp8_gemv.py sets the
// attribute), wait here until the kernel before it has finished and its writes are
// visible; without the attribute this returns at once. Everything before it may only read
// what no earlier kernel of the step writes (the weights). Hopper and newer; on Ada the
// launch is never early (fp8_gemv.py).
__device__ __forceinline__ void wait_for_previous_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Let the next kernel on the stream launch early, if it was launched with the attribute
// (its blocks then take multiprocessors as ours finish, and wait for our writes).
__device__ __forceinline__ void allow_next_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A pointer that the compiler cannot compute before this point (volatile asms keep their
// order): loads through it stay after the wait without being volatile themselves.
__device__ __forceinline__ const uint8_t* after_wait(const uint8_t* p) {
  asm volatile("mov.b64 %0, %0;" : "+l"(p));
  return p;
}

// Sum of the group's code products (exact products, float32 sums) for each weight tile and
// token tile; the token fragments are widened once and serve all RT weight tiles.
template <int MT, int RT>
__device__ __forceinline__ void multiply_group(const Group<MT, RT>& grp, float (&acc)[RT][MT][4]) {
  zero(acc);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t b0[MT], b1[MT];
#pragma unroll
    for (int tile = 0; tile < MT; ++tile) {
      b0[tile] = e4m3x2_to_f16x2(grp.a[tile][j]);        // token r, k + {0, 1}
      b1[tile] = e4m3x2_to_f16x2(grp.a[tile][j] >> 16);  // token r, k + {2, 3}
    }
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const uint32_t a0 = e4m3x2_to_f16x2(grp.w0[rt][j]);        // row r,     k + {0, 1}
      const uint32_t a1 = e4m3x2_to_f16x2(grp.w1[rt][j]);        // row r + 8, k + {0, 1}
      const uint32_t a2 = e4m3x2_to_f16x2(grp.w0[rt][j] >> 16);  // row r,     k + {2, 3}
      const uint32_t a3 = e4m3x2_to_f16x2(grp.w1[rt][j] >> 16);  // row r + 8, k + {2, 3}
#pragma unroll
      for (int tile = 0; tile < MT; ++tile) mma_16816(acc[rt][tile], a0, a1, a2, a3, b0[tile], b1[tile]);
    }
  }
}

// total += the group's code-product sums times their scales (token row scale x the
// block's weight scale).
template <int MT, int RT>
__device__ __forceinline__ void add_scaled(float (&total)[RT][MT][4], const float (&acc)[RT][MT][4],
                                           const float* a_s, const int (&scale_rows)[MT][2],
                                           long long a_s_stride_m, long long a_s_stride_g, int g, float w_scale) {
#pragma unroll
  for (int tile = 0; tile < MT; ++tile) {
    const float s0 = a_s[scale_rows[tile][0] * a_s_stride_m + g * a_s_stride_g] * w_scale;
    const float s1 = a_s[scale_rows[tile][1] * a_s_stride_m + g * a_s_stride_g] * w_scale;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      total[rt][tile][0] += acc[rt][tile][0] * s0;  // weight row r,     token 2t
      total[rt][tile][1] += acc[rt][tile][1] * s1;  // weight row r,     token 2t + 1
      total[rt][tile][2] += acc[rt][tile][2] * s0;  // weight row r + 8, token 2t
      total[rt][tile][3] += acc[rt][tile][3] * s1;  // weight row r + 8, token 2t + 1
    }
  }
}

// A weight row's partial sums in shared memory: its 8 MT token columns and one word of
// padding, so that the reduction's reads (consecutive threads, consecutive weight rows)
// land in distinct banks; unpadded they were 8-way bank conflicts at 16 token rows
// (Nsight Compute on the H200, 2026-12-01), paid once per block at its end.
template <int MT>
__host__ __device__ constexpr int partial_row() {
  return 8 * MT + 1;
}

// A thread's sums of its RT row tiles into shared memory, rows row0 + 16 rt + {r, r + 8} of
// its slice of the partial sums.
template <int MT, int RT, int ROWS>
__device__ __forceinline__ void write_partial(float (&slice)[ROWS][partial_row<MT>()], int row0,
                                              const float (&total)[RT][MT][4]) {
  const int lane = threadIdx.x & 31;
  const int r = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int tile = 0; tile < MT; ++tile) {
      const int m = 2 * t + 8 * tile;
      slice[row0 + 16 * rt + r][m] = total[rt][tile][0];
      slice[row0 + 16 * rt + r][m + 1] = total[rt][tile][1];
      slice[row0 + 16 * rt + r + 8][m] = total[rt][tile][2];
      slice[row0 + 16 * rt + r + 8][m + 1] = total[rt][tile][3];
    }
  }
}

// The SLICES slices of partial sums added in slice order (the same result on every run);
// BF16 (round to nearest even) out for the rows that exist. After a barrier over the
// block's THREADS threads, which all take part.
template <int MT, int ROWS, int SLICES, int THREADS>
__device__ __forceinline__ void sum_partials_and_store(const float (&partial)[SLICES][ROWS][partial_row<MT>()],
                                                       uint16_t* __restrict__ y, long long y_stride, long long n0,
                                                       int last_row) {
  for (int idx = threadIdx.x; idx < ROWS * 8 * MT; idx += THREADS) {
    const int n = idx % ROWS;
    const int m = idx / ROWS;
    if (m <= last_row) {
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < SLICES; ++s) sum += partial[s][n][m];
      y[m * y_stride + n0 + n] = f32_to_bf16_rne(sum);
    }
  }
}

// The warps' partial sums meet in shared memory and are added in warp order (the same
// result on every run); BF16 (round to nearest even) out for the rows that exist.
template <int MT, int RT, int WARPS>
__device__ __forceinline__ void reduce_and_store(float (&partial)[WARPS][16 * RT][partial_row<MT>()],
                                                 const float (&total)[RT][MT][4], uint16_t* __restrict__ y,
                                                 long long y_stride, long long n0, int last_row) {
  write_partial<MT, RT, 16 * RT>(partial[threadIdx.x >> 5], 0, total);
  __syncthreads();
  sum_partials_and_store<MT, 16 * RT, WARPS, WARPS * 32>(partial, y, y_stride, n0, last_row);
}

}  // namespace quantroll_gemv

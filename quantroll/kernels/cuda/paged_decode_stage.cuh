// Building blocks of the FP8-cache decode attention in paged_decode_fp8.cu: the stage layout
// of a warp's 32-key chunk in shared memory and its cp.async, and the register-level
// conversions. paged_decode_fp8.cu says how the work is laid out; everything here is per
// thread (or, for load_chunk, per warp) and pure.

#pragma once

#include <math.h>
#include <stdint.h>

namespace quantroll_paged {

constexpr int D = 128;           // head_dim
constexpr int BLOCK = 16;        // positions per cache block
constexpr int CHUNK = 32;        // keys per warp step (two cache blocks)
constexpr int KEY_STAGE = CHUNK * D;                 // 4 KB of key codes
constexpr int VALUE_PAGE = D * BLOCK + 64;           // 2 KB of value codes + 64 B (second block's bank shift)
constexpr int VALUE_STAGE = 2 * VALUE_PAGE;
constexpr int SCALE_STAGE = 2 * 2 * BLOCK * 4;       // key and value scales of two blocks
constexpr int STAGE = KEY_STAGE + VALUE_STAGE + SCALE_STAGE;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two float32 -> one f16x2 register: `lo` in the lower half (the mma slot of the lower column).
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

__device__ __forceinline__ float bf16_to_f32(uint16_t x) { return __uint_as_float(static_cast<uint32_t>(x) << 16); }

// The 4 E4M3 codes of `word` as two f16x2 registers: bytes 0-1 into `lo`, bytes 2-3 into `hi`
// (the halves taken as 16-bit registers: no shift before the conversion).
__device__ __forceinline__ void widen4(uint32_t word, uint32_t& lo, uint32_t& hi) {
  uint16_t a, b;
  asm("mov.b32 {%0, %1}, %2;" : "=h"(a), "=h"(b) : "r"(word));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"(a));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"(b));
}

constexpr float FP32_TINY = 1.1754943508222875e-38f;  // the smallest normal float32, as the Triton quantize uses

// float32 -> E4M3 code (round to nearest even; the caller has clamped to +-448)
__device__ __forceinline__ uint8_t e4m3_of(float x) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(pair & 0xff);
}

// Byte offset of 16-byte piece `c` of key row `row` in a key stage: pieces XOR-swizzled by
// the row, so that the 8 rows a quarter warp reads at once fall in distinct banks.
__device__ __forceinline__ int key_piece(int row, int c) { return row * D + ((c ^ (row & 7)) << 4); }

struct Chunk {
  int blocks[2];  // cache blocks of its two halves (0, in bounds, past the sequence)
};

__device__ __forceinline__ Chunk chunk_at(const int* table_row, int first_key, int length) {
  Chunk c;
  const int pages = (length + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int page = first_key / BLOCK + h;
    c.blocks[h] = page < pages ? table_row[page] : 0;
  }
  return c;
}

// One warp's cp.async of a chunk into `stage`: 32 key rows (8 pieces each), two value blocks
// (128 pieces each), and the 4 x 16 scales (4 pieces each).
__device__ __forceinline__ void load_chunk(char* stage, const Chunk& c, const uint8_t* k_pool, const uint8_t* v_pool,
                                           const float* k_scale, const float* v_scale, int kvh, int hkv, int lane) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int piece = lane + 32 * i;  // 256 pieces: row = piece / 8
    const int row = piece >> 3, c16 = piece & 7;
    const long long slot = static_cast<long long>(c.blocks[row >> 4]) * BLOCK + (row & 15);
    cp_async16(stage + key_piece(row, c16), k_pool + (slot * hkv + kvh) * D + c16 * 16);
  }
  char* values = stage + KEY_STAGE;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int piece = lane + 32 * i;  // 2 blocks x 128 pieces
    const int h = piece >> 7, p = piece & 127;
    const long long base = (static_cast<long long>(c.blocks[h]) * hkv + kvh) * (D * BLOCK);
    cp_async16(values + h * VALUE_PAGE + p * 16, v_pool + base + p * 16);
  }
  if (lane < 16) {  // key scales of block 0, 1, then value scales of block 0, 1: 4 pieces each
    const int which = lane >> 3, h = (lane >> 2) & 1, p = lane & 3;
    const long long block = h ? c.blocks[1] : c.blocks[0];  // (an indexed c.blocks[h] would live in local memory)
    const float* src = (which ? v_scale : k_scale) + (block * hkv + kvh) * BLOCK + p * 4;
    cp_async16(stage + KEY_STAGE + VALUE_STAGE + ((which * 2 + h) * BLOCK + p * 4) * 4, src);
  }
}

}  // namespace quantroll_paged

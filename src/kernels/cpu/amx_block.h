// The AMX micro-kernel both AMX users share (bf16_gemm.cc's GEMM, amx.cc's attention tile
// products): one block of C, at most 32 x 32, as four accumulator tiles (tmm0-3), with per 32 k
// two tiles of A (16 rows x 32 k, tmm4-5) and two of B (16 pairs of k x 16 columns, tmm6-7),
// four TDPBF16PS.
//
//   C[0:rows, 0:cols] = alpha * A B + beta * C       (beta = 0 never reads C)
//
// With alpha 1 and beta 0 or 1, C goes through the tiles: the accumulators start from C
// (beta 1) or zero, the products are added into them, and they are stored back; a block at an
// edge of C (rows or cols < 32) goes the same way through a 32 x 32 buffer on the stack, so
// every element of C gets the same arithmetic wherever its block lies. Otherwise the tiles
// start at zero and C = alpha * tiles + beta * C is formed from the buffer.
//
// Only for builds with AMX (UNTIED_HAVE_AMX, defined here); the caller holds an AmxTiles.
#pragma once

#include "kernels/cpu/bf16_simd.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define UNTIED_HAVE_AMX 1
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace untied::cpu {

// Where the block's operands lie, in bytes: the A tiles of rows 0-15 (a0) and 16-31 (a1), each
// tile row a_stride after the previous and each 32-k chunk a_step after the previous; the B
// tiles of columns 0-15 (b) and 16-31 (b + 64), each tile row (a pair of k for 16 columns)
// b_stride apart and each chunk b_step after the previous.
struct AmxOperands {
  const char *a0, *a1;
  int64_t a_stride, a_step;
  const char* b;
  int64_t b_stride, b_step;
};

inline void amx_block(int64_t chunks, const AmxOperands& op, float* c, int64_t ldc, int64_t rows, int64_t cols,
                      float alpha, float beta) {
  alignas(64) float buf[32][32];
  const bool through = alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
  const bool whole = rows == 32 && cols == 32;
  float* tc = c;  // where the tiles load and store C
  int64_t tld = ldc;
  if (through && !whole) {
    tc = &buf[0][0], tld = 32;
    if (beta != 0.0f)
      for (int64_t r = 0; r < rows; ++r) std::memcpy(buf[r], c + r * ldc, cols * sizeof(float));
  }
  memory_barrier();
  if (through && beta != 0.0f) {
    _tile_loadd(0, tc, tld * 4);
    _tile_loadd(1, tc + 16, tld * 4);
    _tile_loadd(2, tc + 16 * tld, tld * 4);
    _tile_loadd(3, tc + 16 * tld + 16, tld * 4);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const char* b = op.b + ch * op.b_step;
    _tile_loadd(4, op.a0 + ch * op.a_step, op.a_stride);
    _tile_loadd(5, op.a1 + ch * op.a_step, op.a_stride);
    _tile_loadd(6, b, op.b_stride);
    _tile_loadd(7, b + 64, op.b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  if (!through) tc = &buf[0][0], tld = 32;
  _tile_stored(0, tc, tld * 4);
  _tile_stored(1, tc + 16, tld * 4);
  _tile_stored(2, tc + 16 * tld, tld * 4);
  _tile_stored(3, tc + 16 * tld + 16, tld * 4);
  memory_barrier();
  if (through) {
    if (!whole)
      for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * ldc, buf[r], cols * sizeof(float));
    return;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __mmask16 m0 = first_bits16(cols), m1 = first_bits16(cols - 16);
  for (int64_t r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, _mm512_load_ps(&buf[r][0])), x1 = _mm512_mul_ps(va, _mm512_load_ps(&buf[r][16]));
    if (beta != 0.0f) {
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), x1);
    }
    _mm512_mask_storeu_ps(cr, m0, x0);
    _mm512_mask_storeu_ps(cr + 16, m1, x1);
  }
}

}  // namespace untied::cpu

#endif

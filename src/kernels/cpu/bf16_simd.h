// AVX-512 helpers shared by the bf16 kernels (bf16_gemm.cc, amx.cc): masks of the first n
// lanes, the interleaving of two rows of bf16 into pairs, a 16 x 16 transpose of 32-bit lanes (a
// pair of bf16 per lane), and the compiler barrier the tile intrinsics need. Only for builds with
// AVX-512 (the includers check).
#pragma once

#include <cstdint>

namespace untied::cpu {
// x rounded up to a multiple of `to` (any build).
inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
}  // namespace untied::cpu

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace untied::cpu {

inline __mmask32 first_bits32(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << std::max<int64_t>(n, 0)) - 1;
}
inline __mmask16 first_bits16(int64_t n) {
  return n >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
}

// (GCC 12's shift and widening intrinsics pass an undefined vector as their unused merge source,
// which -Wmaybe-uninitialized reports as a use, as for transpose16 below.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// 16 fp32 values rounded to bf16 as float_to_bf16 (dtype.h) rounds one: to nearest even, subnormals
// kept, a NaN kept quiet (VCVTNEPS2BF16 would flush subnormals); lanes in `m` stored at dst.
inline void store_bf16_rounded(uint16_t* dst, __mmask16 m, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  _mm512_mask_cvtepi32_storeu_epi16(dst, m, r);
}

// 16 bf16 at src (lanes in `m`, the rest zero) widened to fp32.
inline __m512 load_bf16_widened(const uint16_t* src, __mmask16 m) {
  const __m256i h = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(static_cast<__mmask32>(m), src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#pragma GCC diagnostic pop

// Interleaving two rows of 32 bf16 (x0 = row 2p, x1 = row 2p + 1) into 32 pairs with
// _mm512_permutex2var_epi16(x0, index, x1): kLoPairs gives pairs 0..15, kHiPairs 16..31 (indices
// 0-31 pick from x0, 32-63 from x1).
inline const __m512i kLoPairs = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                                 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
inline const __m512i kHiPairs = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55,
                                                 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);

// The asm behind GCC's tile intrinsics names no memory: the compiler is told where tiles read
// what was written before, and where memory is read after tiles were stored.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

// In place: r[i] lane j <- r[j] lane i, for 16 vectors of 16 32-bit lanes (interleaves of 32
// and 64 bits within 128-bit lanes, then two exchanges of 128-bit lanes). (GCC 12's unpack
// intrinsics pass an undefined vector as their unused merge source, which -Wmaybe-uninitialized
// reports as a use.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + j], 128-bit lane L: rows 4i..4i+3 of column 4L + j.
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i x = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), y = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
    const __m512i z = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88), w = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    r[j] = _mm512_shuffle_i32x4(x, z, 0x88);       // column j
    r[4 + j] = _mm512_shuffle_i32x4(y, w, 0x88);   // column 4 + j
    r[8 + j] = _mm512_shuffle_i32x4(x, z, 0xDD);   // column 8 + j
    r[12 + j] = _mm512_shuffle_i32x4(y, w, 0xDD);  // column 12 + j
  }
}
#pragma GCC diagnostic pop

}  // namespace untied::cpu

#endif

// AVX-512 helpers shared by the bf16 kernels (bf16_gemm.cc, amx.cc): masks of the first n
// lanes, and a 16 x 16 transpose of 32-bit lanes (a pair of bf16 per lane). Only for builds with
// AVX-512 (the includers check).
#pragma once

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

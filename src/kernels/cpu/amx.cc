// AMX: permission, tile configuration and the attention's tile products (amx.h).
#include "kernels/cpu/amx.h"

#include <algorithm>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/cpu/amx_block.h"
#include "kernels/cpu/bf16_simd.h"
#include "untied/core/check.h"

#if defined(UNTIED_HAVE_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace untied::cpu {

namespace {

// CPUID leaf 7: EDX bits 22 (AMX-BF16) and 24 (AMX-TILE).
bool cpu_has_amx_bf16() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  return (d >> 22 & 1u) != 0 && (d >> 24 & 1u) != 0;
#else
  return false;
#endif
}

}  // namespace

bool cpu_has_amx() { return cpu_has_amx_bf16(); }

bool cpu_is_intel() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
#else
  return false;
#endif
}

bool amx_compiled() {
#if defined(UNTIED_HAVE_AMX)
  return true;
#else
  return false;
#endif
}

bool amx_usable() {
#if defined(UNTIED_HAVE_AMX)
  // Tile data is a feature Linux (5.16 and later) hands out per process on request.
  static const bool ok = cpu_has_amx_bf16() &&
                         syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  return ok;
#else
  return false;
#endif
}

bool amx_rows_in_place(int64_t m, int64_t k, int64_t lda) { return m % 32 == 0 && k % 32 == 0 && lda * 2 % 4096 != 0; }

int64_t amx_packed_a_elems(int64_t m, int64_t k) { return round_up(m, 32) * round_up(k, 32); }
int64_t amx_packed_b_elems(int64_t k, int64_t n) { return round_up(k, 32) * round_up(n, 32); }

#if defined(UNTIED_HAVE_AMX)

namespace {

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// 16 fp32 of row `lo` and 16 of row `hi` (masked loads: lanes past `lanes` zero) rounded to bf16
// and interleaved into 16 pairs (lo_j, hi_j), one 32-bit word per lane j.
const __m512i kPairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                        21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);

inline __m512i pairs16(const float* lo, const float* hi, __mmask16 lanes) {
  const __m512 l = lo ? _mm512_maskz_loadu_ps(lanes, lo) : _mm512_setzero_ps();
  const __m512 h = hi ? _mm512_maskz_loadu_ps(lanes, hi) : _mm512_setzero_ps();
  return _mm512_permutexvar_epi16(kPairs, (__m512i)_mm512_cvtne2ps_pbh(h, l));
}

}  // namespace

AmxTiles::AmxTiles() {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  memory_barrier();  // the intrinsic's asm claims to read only the first 8 bytes of cfg
  _tile_loadconfig(&cfg);
}
AmxTiles::~AmxTiles() { _tile_release(); }

void amx_pack_a(uint16_t* dst, bool trans_a, const float* a, int64_t lda, int64_t m, int64_t k) {
  const int64_t tiles = round_up(m, 32) / 16, chunks = round_up(k, 32) / 32;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rows = std::clamp<int64_t>(m - 16 * t, 0, 16), r0 = 16 * t;
    for (int64_t c = 0; c < chunks; ++c) {
      uint16_t* out = dst + (t * chunks + c) * 512;
      const int64_t k0 = 32 * c, kn = std::min<int64_t>(32, k - k0);
      if (!trans_a) {  // a tile row: 32 consecutive k of a row of A
        const __mmask16 l0 = first_bits16(kn), l1 = first_bits16(kn - 16);
        for (int64_t r = 0; r < 16; ++r) {
          __m512i x = _mm512_setzero_si512();
          if (r < rows) {
            const float* src = a + (r0 + r) * lda + k0;
            x = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(l1, src + 16), _mm512_maskz_loadu_ps(l0, src));
          }
          _mm512_storeu_si512(out + 32 * r, x);
        }
        continue;
      }
      // A is (k, m): x[q] holds pair q of k for each of the 16 rows; transposed, row by row.
      const __mmask16 lanes = first_bits16(rows);
      __m512i x[16];
      for (int64_t q = 0; q < 16; ++q) {
        const float* lo = 2 * q < kn ? a + (k0 + 2 * q) * lda + r0 : nullptr;
        const float* hi = 2 * q + 1 < kn ? a + (k0 + 2 * q + 1) * lda + r0 : nullptr;
        x[q] = pairs16(lo, hi, lanes);
      }
      transpose16(x);
      for (int64_t r = 0; r < 16; ++r) _mm512_storeu_si512(out + 32 * r, x[r]);
    }
  }
}

void amx_pack_b(uint16_t* dst, const float* b, int64_t ldb, int64_t k, int64_t n) {
  const int64_t np = round_up(n, 32), pairs = round_up(k, 32) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const float* lo = 2 * p < k ? b + 2 * p * ldb : nullptr;
    const float* hi = 2 * p + 1 < k ? b + (2 * p + 1) * ldb : nullptr;
    for (int64_t j = 0; j < np; j += 16)
      _mm512_storeu_si512(dst + (p * np + j) * 2,
                          pairs16(lo ? lo + j : nullptr, hi ? hi + j : nullptr, first_bits16(n - j)));
  }
}

void amx_pack_a(uint16_t* dst, const uint16_t* a, int64_t lda, int64_t m, int64_t k) {
  const int64_t tiles = round_up(m, 32) / 16, chunks = round_up(k, 32) / 32;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rows = std::clamp<int64_t>(m - 16 * t, 0, 16);
    for (int64_t c = 0; c < chunks; ++c) {
      uint16_t* out = dst + (t * chunks + c) * 512;
      const __mmask32 km = first_bits32(k - 32 * c);
      for (int64_t r = 0; r < 16; ++r)
        _mm512_storeu_si512(out + 32 * r, r < rows ? _mm512_maskz_loadu_epi16(km, a + (16 * t + r) * lda + 32 * c)
                                                   : _mm512_setzero_si512());
    }
  }
}

void amx_pack_b(uint16_t* dst, const uint16_t* b, int64_t ldb, int64_t k, int64_t n) {
  const int64_t np = round_up(n, 32), pairs = round_up(k, 32) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    for (int64_t j = 0; j < np; j += 32) {
      const __mmask32 cm = first_bits32(n - j);
      const __m512i lo = 2 * p < k ? _mm512_maskz_loadu_epi16(cm, b + 2 * p * ldb + j) : _mm512_setzero_si512();
      const __m512i hi =
          2 * p + 1 < k ? _mm512_maskz_loadu_epi16(cm, b + (2 * p + 1) * ldb + j) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + (p * np + j) * 2, _mm512_permutex2var_epi16(lo, kLoPairs, hi));
      _mm512_storeu_si512(dst + (p * np + j + 16) * 2, _mm512_permutex2var_epi16(lo, kHiPairs, hi));
    }
  }
}

void amx_pack_bt(uint16_t* dst, const uint16_t* bt, int64_t ldbt, int64_t k, int64_t n) {
  const int64_t np = round_up(n, 32), chunks = round_up(k, 32) / 32;
  __m512i r[16];
  for (int64_t j = 0; j < np; j += 16) {
    const int64_t cols = std::clamp<int64_t>(n - j, 0, 16);  // rows of bt
    for (int64_t c = 0; c < chunks; ++c) {
      const __mmask32 km = first_bits32(k - 32 * c);
      for (int64_t i = 0; i < 16; ++i)
        r[i] = i < cols ? _mm512_maskz_loadu_epi16(km, bt + (j + i) * ldbt + 32 * c) : _mm512_setzero_si512();
      transpose16(r);  // r[q]: pair q of the chunk for each of the 16 columns
      for (int64_t q = 0; q < 16; ++q) _mm512_storeu_si512(dst + ((16 * c + q) * np + j) * 2, r[q]);
    }
  }
}

namespace {

// Where the A tiles of rows 32i.. lie: rows 0-15 at base + i * group, rows 16-31 `half` further;
// tile rows `stride` apart, chunks of 32 k `step` apart (bytes).
struct ATiles {
  const char* base;
  int64_t group, half, stride, step;
};

void tile_product(int64_t m, int64_t n, int64_t k, float alpha, const ATiles& a, const uint16_t* b_packed, float beta,
                  float* c, int64_t ldc) {
  UNTIED_CHECK(beta == 0.0f || beta == 1.0f, "amx_tile_product: beta must be 0 or 1, got ", beta);
  const int64_t chunks = round_up(k, 32) / 32, np = round_up(n, 32);
  for (int64_t i = 0; i < m; i += 32) {
    const char* a0 = a.base + i / 32 * a.group;
    for (int64_t j = 0; j < n; j += 32) {
      const AmxOperands op{.a0 = a0, .a1 = a0 + a.half, .a_stride = a.stride, .a_step = a.step,
                           .b = reinterpret_cast<const char*>(b_packed + j * 2), .b_stride = np * 4,
                           .b_step = 16 * np * 4};
      amx_block(chunks, op, c + i * ldc + j, ldc, std::min<int64_t>(32, m - i), std::min<int64_t>(32, n - j), alpha,
                beta);
    }
  }
}

}  // namespace

void amx_tile_product(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a_packed,
                      const uint16_t* b_packed, float beta, float* c, int64_t ldc) {
  const int64_t tile = round_up(k, 32) / 32 * 1024;  // bytes of a 16-row tile's chunks
  tile_product(m, n, k, alpha, ATiles{reinterpret_cast<const char*>(a_packed), 2 * tile, tile, 64, 1024}, b_packed,
               beta, c, ldc);
}

void amx_tile_product_rows(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                           const uint16_t* b_packed, float beta, float* c, int64_t ldc) {
  UNTIED_CHECK(amx_rows_in_place(m, k, lda), "amx_tile_product_rows: A (", m, ", ", k, ") with lda ", lda,
               " cannot be read in place");
  tile_product(m, n, k, alpha, ATiles{reinterpret_cast<const char*>(a), 32 * lda * 2, 16 * lda * 2, lda * 2, 64},
               b_packed, beta, c, ldc);
}

#else  // no AMX in this build

AmxTiles::AmxTiles() { UNTIED_CHECK(false, "AmxTiles: this build has no AMX (check amx_usable())"); }
AmxTiles::~AmxTiles() = default;
void amx_pack_a(uint16_t*, bool, const float*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "amx_pack_a: this build has no AMX");
}
void amx_pack_b(uint16_t*, const float*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "amx_pack_b: this build has no AMX");
}
void amx_pack_a(uint16_t*, const uint16_t*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "amx_pack_a: this build has no AMX");
}
void amx_pack_b(uint16_t*, const uint16_t*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "amx_pack_b: this build has no AMX");
}
void amx_pack_bt(uint16_t*, const uint16_t*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "amx_pack_bt: this build has no AMX");
}
void amx_tile_product(int64_t, int64_t, int64_t, float, const uint16_t*, const uint16_t*, float, float*, int64_t) {
  UNTIED_CHECK(false, "amx_tile_product: this build has no AMX");
}
void amx_tile_product_rows(int64_t, int64_t, int64_t, float, const uint16_t*, int64_t, const uint16_t*, float, float*,
                           int64_t) {
  UNTIED_CHECK(false, "amx_tile_product_rows: this build has no AMX");
}

#endif

}  // namespace untied::cpu

// bf16 GEMM on AVX512-BF16 (bf16_gemm.h).
//
// Loops, outermost first: columns of C by kNc; k by kKc, packing that block of op(B) (shared);
// rows of C by kMc, one block per thread at a time, packing that block of op(A) (the thread's
// own); 32-column panels of the packed B (one panel, kKc x 32 bf16 = 16 KiB, stays in L1 while
// every 12-row panel of the A block runs over it); 12-row panels of A. The micro-kernel keeps
// 12 x 32 fp32 of C in 24 registers and, per pair of k, loads two vectors of B and broadcasts
// 12 pairs of A: 24 VDPBF16PS, each 32 multiply-adds.
//
// Packed layouts (p: index of a pair of k within the block):
//   B panel: [p][32 columns][2] bf16, the pair (op(B)(2p, j), op(B)(2p + 1, j)) per column;
//   A panel: [p][12 rows] pairs (op(A)(i, 2p), op(A)(i, 2p + 1)) as 32-bit words.
// Past the edges of m, n and an odd k, the packs hold zeros and the kernel stores only the
// rows and columns that exist.
#include "kernels/cpu/bf16_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "untied/core/check.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define UNTIED_HAVE_BF16_GEMM 1
#endif

namespace untied::cpu {

#if defined(UNTIED_HAVE_BF16_GEMM)

namespace {

constexpr int kMr = 12;           // rows of a C register block
constexpr int kNr = 32;           // columns of a C register block (two vectors)
constexpr int64_t kKc = 512;      // k per packed block (even): a B panel is 32 KiB
constexpr int64_t kMc = 12 * kMr;  // rows of A per thread block
constexpr int64_t kNc = 2048;     // columns of B per packed block (a multiple of kNr)

// Packing space for a shape: the B block, and an A block per thread that has a block of rows.
struct PackSizes {
  int64_t b_bytes, a_bytes;
  int threads;
};
PackSizes pack_sizes(int64_t m, int64_t n, int64_t k, int threads) {
  const int64_t kc = std::min(kKc, (k + 1) / 2 * 2);
  const int64_t nc = std::min(kNc, (n + kNr - 1) / kNr * kNr);
  const int64_t mc = std::min(kMc, (m + kMr - 1) / kMr * kMr);
  const int64_t mblocks = (m + kMc - 1) / kMc;
  const int used = static_cast<int>(std::clamp<int64_t>(mblocks, 1, std::max(threads, 1)));
  // Each rounded up to 64 bytes, so that the blocks start aligned.
  return {(kc * nc * 2 + 63) / 64 * 64, (mc * kc * 2 + 63) / 64 * 64, used};
}

inline uint32_t pair(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

// Interleaving two rows of 32 bf16 (x0 = op(.)(2p, 0:32), x1 = op(.)(2p + 1, 0:32)) into 32 pairs:
// kLo gives pairs 0..15, kHi pairs 16..31 (permutex2var indices: 0-31 pick from x0, 32-63 from x1).
const __m512i kLo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                     36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
const __m512i kHi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54, 22,
                                     53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);

inline __mmask32 first_bits32(int64_t n) { return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << std::max<int64_t>(n, 0)) - 1; }
inline __mmask16 first_bits16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
}

// Gathers, for pairs p in [0, pairs), the 32-bit pair at `base` + p pairs of each of the rows
// selected by `lanes` (row r at r * ld elements from base), into out[p * stride + lane]. Rows
// whose pairs are adjacent in memory (the operand stored with k along its rows).
void gather_pairs(uint32_t* out, int64_t stride, __mmask16 lanes, const uint16_t* base, int64_t ld, int64_t pairs,
                  __mmask16 store_lanes) {
  const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(static_cast<int>(ld)));
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i g = _mm512_mask_i32gather_epi32(zero, lanes, index, base + 2 * p, 2);
    _mm512_mask_storeu_epi32(out + p * stride, store_lanes, g);
  }
}

// Whether a gather's row offsets (15 rows of ld elements, in bytes) fit its 32-bit indices.
bool gather_fits(int64_t ld) { return ld <= (int64_t{1} << 31) / 32; }

// Packs panel `panel` (32 columns from j0 + 32 panel) of k [p0, p0 + kc) of op(B) at dst.
void pack_b(uint16_t* dst, bool trans_b, const uint16_t* b, int64_t ldb, int64_t n, int64_t p0, int64_t kc,
            int64_t j0, int64_t panel) {
  const int64_t kp = (kc + 1) / 2, full = kc / 2;  // pairs; pairs with both halves in k
  uint32_t* out = reinterpret_cast<uint32_t*>(dst + panel * kp * kNr * 2);
  const int64_t jb = j0 + panel * kNr;
  const int64_t cols = std::clamp<int64_t>(n - jb, 0, kNr);
  if (!trans_b) {  // B is (k, n): interleave two rows
    const __mmask32 cm = first_bits32(cols);
    for (int64_t p = 0; p < kp; ++p) {
      const uint16_t* r0 = b + (p0 + 2 * p) * ldb + jb;
      const __m512i x0 = _mm512_maskz_loadu_epi16(cm, r0);
      const __m512i x1 = p < full ? _mm512_maskz_loadu_epi16(cm, r0 + ldb) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + p * kNr, _mm512_permutex2var_epi16(x0, kLo, x1));
      _mm512_storeu_si512(out + p * kNr + 16, _mm512_permutex2var_epi16(x0, kHi, x1));
    }
    return;
  }
  // B is (n, k): each column's pairs are adjacent; gather 16 columns per pair.
  for (int64_t c0 = 0; c0 < kNr; c0 += 16) {
    const int64_t here = std::clamp<int64_t>(cols - c0, 0, 16);
    const uint16_t* base = b + (jb + c0) * ldb + p0;
    if (gather_fits(ldb)) {
      gather_pairs(out + c0, kNr, first_bits16(here), base, ldb, full, 0xFFFF);
    } else {
      for (int64_t p = 0; p < full; ++p)
        for (int64_t c = 0; c < 16; ++c) out[p * kNr + c0 + c] = c < here ? pair(base[c * ldb + 2 * p], base[c * ldb + 2 * p + 1]) : 0;
    }
    if (full < kp)  // odd k: the last pair's upper half is zero
      for (int64_t c = 0; c < 16; ++c) out[full * kNr + c0 + c] = c < here ? pair(base[c * ldb + 2 * full], 0) : 0;
  }
}

// Packs rows [i0, i0 + mc) and k [p0, p0 + kc) of op(A) into 12-row panels at dst.
void pack_a(uint32_t* dst, bool trans_a, const uint16_t* a, int64_t lda, int64_t i0, int64_t mc, int64_t p0,
            int64_t kc) {
  const int64_t kp = (kc + 1) / 2, full = kc / 2;
  const int64_t panels = (mc + kMr - 1) / kMr;
  constexpr __mmask16 kPanel = (1u << kMr) - 1;
  for (int64_t ip = 0; ip < panels; ++ip) {
    uint32_t* out = dst + ip * kp * kMr;
    const int64_t rows = std::min<int64_t>(kMr, mc - ip * kMr);
    const int64_t r0 = i0 + ip * kMr;
    if (trans_a) {  // A is (k, m): interleave two rows of 12 rows' values
      const __mmask32 rm = first_bits32(rows);
      for (int64_t p = 0; p < kp; ++p) {
        const uint16_t* src = a + (p0 + 2 * p) * lda + r0;
        const __m512i x0 = _mm512_maskz_loadu_epi16(rm, src);
        const __m512i x1 = p < full ? _mm512_maskz_loadu_epi16(rm, src + lda) : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(out + p * kMr, kPanel, _mm512_permutex2var_epi16(x0, kLo, x1));
      }
      continue;
    }
    // A is (m, k): each row's pairs are adjacent; gather the panel's 12 rows per pair.
    const uint16_t* base = a + r0 * lda + p0;
    if (gather_fits(lda)) {
      gather_pairs(out, kMr, first_bits16(rows), base, lda, full, kPanel);
    } else {
      for (int64_t p = 0; p < full; ++p)
        for (int64_t r = 0; r < kMr; ++r) out[p * kMr + r] = r < rows ? pair(base[r * lda + 2 * p], base[r * lda + 2 * p + 1]) : 0;
    }
    if (full < kp)
      for (int64_t r = 0; r < kMr; ++r) out[full * kMr + r] = r < rows ? pair(base[r * lda + 2 * full], 0) : 0;
  }
}

// C[0:rows, 0:cols] = alpha * Apanel Bpanel + (accumulate ? beta * C : 0).
inline void micro(int64_t kp, const uint32_t* ap, const uint16_t* bp, float* c, int64_t ldc, int64_t rows,
                  int64_t cols, float alpha, bool accumulate, float beta) {
  __m512 acc[kMr][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) {
    acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    // C's rows lie far apart (ldc): fetch them while the products run, not at the end.
    if (accumulate && r < rows) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
    }
  }
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * kNr);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * 2 * kNr + kNr);
    const uint32_t* ar = ap + p * kMr;
#pragma GCC unroll 12
    for (int r = 0; r < kMr; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(ar[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __mmask16 m0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : static_cast<__mmask16>((1u << (cols - 16)) - 1);
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) {
    if (r >= rows) break;
    float* cr = c + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, acc[r][0]), x1 = _mm512_mul_ps(va, acc[r][1]);
    if (accumulate) {
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), x1);
    }
    _mm512_mask_storeu_ps(cr, m0, x0);
    _mm512_mask_storeu_ps(cr + 16, m1, x1);
  }
}

}  // namespace

bool bf16_gemm_available() { return true; }

int64_t bf16_gemm_pack_bytes(int64_t m, int64_t n, int64_t k, int threads) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const PackSizes ps = pack_sizes(m, n, k, threads);
  return ps.b_bytes + ps.threads * ps.a_bytes;
}

void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads,
               void* pack) {
  if (m <= 0 || n <= 0) return;
  UNTIED_CHECK(k > 0, "bf16_gemm needs k > 0 (the caller defines C = beta C for k = 0)");
  const PackSizes ps = pack_sizes(m, n, k, threads);
  uint16_t* const bpack = static_cast<uint16_t*>(pack);
  char* const apacks = static_cast<char*>(pack) + ps.b_bytes;
  const int64_t mblocks = (m + kMc - 1) / kMc;

#pragma omp parallel num_threads(ps.threads)
  {
    uint32_t* const apack = reinterpret_cast<uint32_t*>(apacks + omp_get_thread_num() * ps.a_bytes);
    for (int64_t j0 = 0; j0 < n; j0 += kNc) {
      const int64_t nc = std::min(kNc, n - j0);
      const int64_t panels = (nc + kNr - 1) / kNr;
      for (int64_t p0 = 0; p0 < k; p0 += kKc) {
        const int64_t kc = std::min(kKc, k - p0);
        const int64_t kp = (kc + 1) / 2;
        // The first block along k applies beta; later ones add to C.
        const bool accumulate = p0 > 0 || beta != 0.0f;
        const float bk = p0 > 0 ? 1.0f : beta;
#pragma omp for schedule(static)
        for (int64_t jp = 0; jp < panels; ++jp) pack_b(bpack, trans_b, b, ldb, n, p0, kc, j0, jp);
#pragma omp for schedule(static)
        for (int64_t ib = 0; ib < mblocks; ++ib) {
          const int64_t i0 = ib * kMc, mc = std::min(kMc, m - i0);
          pack_a(apack, trans_a, a, lda, i0, mc, p0, kc);
          const int64_t apanels = (mc + kMr - 1) / kMr;
          for (int64_t jp = 0; jp < panels; ++jp) {
            const uint16_t* bp = bpack + jp * kp * kNr * 2;
            const int64_t cols = std::min<int64_t>(kNr, nc - jp * kNr);
            for (int64_t ip = 0; ip < apanels; ++ip) {
              const int64_t rows = std::min<int64_t>(kMr, mc - ip * kMr);
              micro(kp, apack + ip * kp * kMr, bp, c + (i0 + ip * kMr) * ldc + j0 + jp * kNr, ldc, rows, cols,
                    alpha, accumulate, bk);
            }
          }
        }
      }
    }
  }
}

std::string bf16_gemm_description() { return "avx512-bf16 " + std::to_string(kMr) + "x" + std::to_string(kNr); }

#else  // no AVX512-BF16 in this build

bool bf16_gemm_available() { return false; }
int64_t bf16_gemm_pack_bytes(int64_t, int64_t, int64_t, int) { return 0; }
void bf16_gemm(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t, const uint16_t*, int64_t,
               float, float*, int64_t, int, void*) {
  UNTIED_CHECK(false, "bf16_gemm: this build has no AVX512-BF16 kernel (check bf16_gemm_available())");
}
std::string bf16_gemm_description() { return "none"; }

#endif

}  // namespace untied::cpu

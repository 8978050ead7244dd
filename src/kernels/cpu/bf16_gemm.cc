// bf16 GEMM on AVX-512 (bf16_gemm.h): fp32 FMAs on widened panels, the AVX512-BF16 dot-product
// instruction, or AMX.
//
// Loops, outermost first: columns of C by kNc; k by kKc, packing that block of op(B) (shared);
// each thread's own part of C (blocked_loops), its rows by kMc at most, packing that block of
// op(A) (the thread's own); 32-column panels of the packed B (one panel, kKc x 32 bf16 = 32 KiB,
// stays in L1 while every 12-row panel of the A block runs over it); 12-row panels of A. The micro-kernel keeps
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
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/amx_block.h"
#include "kernels/cpu/bf16_simd.h"
#include "untied/core/check.h"

// What this build has: the packing, the loops and the fp32 kernel need AVX-512 F and BW (Intel
// from Skylake-SP on, AMD from Zen 4 on); the dot-product kernel and the attention's bf16 tile
// products AVX512-BF16 as well (Intel from Cooper Lake, AMD Zen 4); AMX its tile instructions.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define UNTIED_HAVE_FMA_GEMM 1
#if defined(__AVX512BF16__)
#define UNTIED_HAVE_DOT_GEMM 1
#endif
#endif

namespace untied::cpu {

namespace {
// Which code runs bf16 GEMMs in this process (chosen_path, at the end of the file).
using Path = Bf16Path;
Path chosen_path();
}  // namespace

#if defined(UNTIED_HAVE_FMA_GEMM)

namespace {

constexpr int kMr = 12;           // rows of a C register block
constexpr int kNr = 32;           // columns of a C register block (two vectors)
constexpr int64_t kKc = 512;      // k per packed block (even): a B panel is 32 KiB
constexpr int64_t kMc = 12 * kMr;  // rows of A per thread block
constexpr int64_t kNc = 2048;     // columns of B per packed block (a multiple of kNr)

// Packing space for a shape: the B block, an A block per thread, and with bf16 C the fp32 sums of
// one block of columns of C (m x nc), for blocks of at most kc_max along k and nc_max columns of
// `elem_bytes` each (bf16 pairs, or the fp32 kernel's widened panels), rows of C in register
// blocks of `mr`. Threads: as many as there are register blocks in a column block, at most.
// The block sizes for this shape (kc, nc, mc: the limits, or less where the shape is smaller)
// are what blocked_loops steps by.
struct PackSizes {
  int64_t kc, nc, mc, mr;
  int64_t b_bytes, a_bytes, c_bytes;
  int threads;
};
PackSizes pack_sizes(int64_t m, int64_t n, int64_t k, int threads, bool c_bf16, int64_t kc_max = kKc,
                     int64_t nc_max = kNc, int64_t elem_bytes = 2, int64_t k_round = 2, int64_t mc_max = kMc,
                     int64_t mr = kMr) {
  const int64_t kc = std::min(kc_max, round_up(k, k_round));
  const int64_t nc = std::min(nc_max, round_up(n, kNr));
  const int64_t mc = std::min(mc_max, round_up(m, mr));
  const int64_t blocks = (m + mr - 1) / mr * (nc / kNr);
  const int used = static_cast<int>(std::clamp<int64_t>(blocks, 1, std::max(threads, 1)));
  // Each rounded up to 64 bytes, so that the blocks start aligned.
  return {kc, nc, mc, mr, round_up(kc * nc * elem_bytes, 64), round_up(mc * kc * elem_bytes, 64),
          c_bf16 ? round_up(m * nc * 4, 64) : 0, used};
}

// For an operand stored with k along its rows (so that a pair is one 32-bit word): rows
// [0, rows) (rows <= 16), k [0, kc): out[p * stride + row] = pair p of the row, for
// p < ceil(kc / 2), lanes `store_lanes` written (rows past `rows` and an odd k's last upper half
// are zero). 16 pairs of 16 rows at a time, transposed in registers; load(i, pb) gives elements
// [32 pb, 32 pb + 32) of row i as bf16, zero past kc.
template <typename LoadRow>
void transpose_pairs_by(uint32_t* out, int64_t stride, __mmask16 store_lanes, int64_t rows, int64_t kc, LoadRow load) {
  const int64_t kp = (kc + 1) / 2;
  __m512i r[16];
  for (int64_t pb = 0; pb * 16 < kp; ++pb) {
    for (int64_t i = 0; i < 16; ++i) r[i] = i < rows ? load(i, pb) : _mm512_setzero_si512();
    transpose16(r);
    const int64_t pairs = std::min<int64_t>(16, kp - 16 * pb);
    for (int64_t q = 0; q < pairs; ++q) _mm512_mask_storeu_epi32(out + (16 * pb + q) * stride, store_lanes, r[q]);
  }
}

// From bf16 rows of `base`, row stride ld elements.
void transpose_pairs(uint32_t* out, int64_t stride, __mmask16 store_lanes, const uint16_t* base, int64_t ld,
                     int64_t rows, int64_t kc) {
  transpose_pairs_by(out, stride, store_lanes, rows, kc, [&](int64_t i, int64_t pb) {
    return _mm512_maskz_loadu_epi16(first_bits32(kc - 32 * pb), base + i * ld + 32 * pb);
  });
}

#if defined(UNTIED_HAVE_DOT_GEMM)
// From fp32 rows, each value rounded to bf16 to nearest even.
void transpose_pairs_f32(uint32_t* out, int64_t stride, __mmask16 store_lanes, const float* base, int64_t ld,
                         int64_t rows, int64_t kc) {
  transpose_pairs_by(out, stride, store_lanes, rows, kc, [&](int64_t i, int64_t pb) {
    const float* src = base + i * ld + 32 * pb;
    // _mm512_cvtne2ps_pbh(x, y): y's 16 values in the lower half, x's in the upper.
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(first_bits16(kc - 32 * pb - 16), src + 16),
                                        _mm512_maskz_loadu_ps(first_bits16(kc - 32 * pb), src));
  });
}
#endif

// op(B) as the packing reads it: B, or its columns gathered in groups of `group` (a multiple of
// 32, so that a panel lies in one group), group g's first at b + offsets[g].
struct BCols {
  const uint16_t* b = nullptr;
  const int64_t* offsets = nullptr;
  int64_t group = 0;
  // op(B)'s column j at k = 0 (its k run ldb apart without trans_b, adjacent with it).
  const uint16_t* col(int64_t j, bool trans_b, int64_t ldb) const {
    const int64_t stride = trans_b ? ldb : 1;
    if (offsets == nullptr) return b + j * stride;
    const int64_t g = j / group;
    return b + offsets[g] + (j - g * group) * stride;
  }
};

// Packs panel `panel` (32 columns from j0 + 32 panel) of k [p0, p0 + kc) of op(B) at dst. A
// panel spans `kp_stride` pairs (at least ceil(kc / 2)); the pairs past kc are zero.
void pack_b(uint16_t* dst, bool trans_b, const BCols& b, int64_t ldb, int64_t n, int64_t p0, int64_t kc,
            int64_t j0, int64_t panel, int64_t kp_stride) {
  const int64_t kp = (kc + 1) / 2, full = kc / 2;  // pairs; pairs with both halves in k
  uint32_t* out = reinterpret_cast<uint32_t*>(dst + panel * kp_stride * kNr * 2);
  if (kp_stride > kp) std::memset(out + kp * kNr, 0, (kp_stride - kp) * kNr * 4);
  const int64_t jb = j0 + panel * kNr;
  const int64_t cols = std::clamp<int64_t>(n - jb, 0, kNr);
  if (!trans_b) {  // B is (k, n): interleave two rows
    const __mmask32 cm = first_bits32(cols);
    for (int64_t p = 0; p < kp; ++p) {
      const uint16_t* r0 = b.col(jb, false, ldb) + (p0 + 2 * p) * ldb;
      const __m512i x0 = _mm512_maskz_loadu_epi16(cm, r0);
      const __m512i x1 = p < full ? _mm512_maskz_loadu_epi16(cm, r0 + ldb) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + p * kNr, _mm512_permutex2var_epi16(x0, kLoPairs, x1));
      _mm512_storeu_si512(out + p * kNr + 16, _mm512_permutex2var_epi16(x0, kHiPairs, x1));
    }
    return;
  }
  // B is (n, k): each column's pairs are adjacent; 16 columns at a time.
  for (int64_t c0 = 0; c0 < kNr; c0 += 16)
    transpose_pairs(out + c0, kNr, 0xFFFF, b.col(jb + c0, true, ldb) + p0, ldb, std::clamp<int64_t>(cols - c0, 0, 16),
                    kc);
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
        _mm512_mask_storeu_epi32(out + p * kMr, kPanel, _mm512_permutex2var_epi16(x0, kLoPairs, x1));
      }
      continue;
    }
    // A is (m, k): each row's pairs are adjacent.
    transpose_pairs(out, kMr, kPanel, a + r0 * lda + p0, lda, rows, kc);
  }
}

// C's rows lie far apart (ldc): a micro-kernel fetches the rows it adds to while its products
// run, not at the end.
inline void prefetch_c(const float* c, int64_t ldc, int64_t rows) {
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r)
    if (r < rows) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
    }
}

// C[0:rows, 0:cols] = alpha * acc + (accumulate ? beta * C : 0), from a register block.
inline void store_block(const __m512 (&acc)[kMr][2], float* c, int64_t ldc, int64_t rows, int64_t cols, float alpha,
                        bool accumulate, float beta) {
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

#if defined(UNTIED_HAVE_DOT_GEMM)
// C[0:rows, 0:cols] = alpha * Apanel Bpanel + (accumulate ? beta * C : 0).
inline void micro(int64_t kp, const uint32_t* ap, const uint16_t* bp, float* c, int64_t ldc, int64_t rows,
                  int64_t cols, float alpha, bool accumulate, float beta) {
  __m512 acc[kMr][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  if (accumulate) prefetch_c(c, ldc, rows);
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
  store_block(acc, c, ldc, rows, cols, alpha, accumulate, beta);
}
#endif

// Where C lives: fp32 at c; or bf16 at c16, each value rounded once from its fp32 sum, which is
// kept in cbuf (m x nc fp32, nc the column block's width) while the k blocks add to it.
struct COut {
  float* c = nullptr;
  uint16_t* c16 = nullptr;
  int64_t ldc = 0;
  float* cbuf = nullptr;
};

// Boundary `i` of `total` split into `parts` near-equal parts, at a multiple of `unit` (the
// last boundary is total).
int64_t split_at(int64_t total, int64_t parts, int64_t i, int64_t unit) {
  if (i >= parts) return total;
  return std::min(total, (total * i / parts + unit / 2) / unit * unit);
}

// `rows` x `cols` of fp32 sums at src (rows lds apart) rounded into bf16 C at dst (rows ldd
// apart); widen_block the other way.
void narrow_block(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; j += 16)
      store_bf16_rounded(dst + r * ldd + j, first_bits16(cols - j),
                         _mm512_maskz_loadu_ps(first_bits16(cols - j), src + r * lds + j));
}
void widen_block(float* dst, int64_t ldd, const uint16_t* src, int64_t lds, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; j += 16)
      _mm512_mask_storeu_ps(dst + r * ldd + j, first_bits16(cols - j), load_bf16_widened(src + r * lds + j,
                                                                                        first_bits16(cols - j)));
}

// The loops every kernel shares, outermost first: columns of C by nc; k by kc, the (kc, nc)
// block of op(B) packed by the threads together, a 32-column panel per call of pack_panel(jp,
// j0, p0, kc); then each thread its own part of C: the threads form a grid of tm groups of
// rows by tn groups of the block's panels (tm the largest divisor of the thread count that
// leaves each group 4 register blocks of mr rows or more), so that every thread has the same
// work to within a register block, whatever m. A thread runs its rows in chunks of at most mc:
// rows(apack, i0, rows, q0, q1, ncur, cb, ldcb, p0, kc, accumulate, beta_k) packs what it needs
// of op(A) into the thread's apack and runs the products of panels [q0, q1) of the block (ncur
// columns) into C at cb (row i0, the block's first column; rows ldcb apart). The first block
// along k applies beta; later ones add to C. With bf16 C, cb is in cbuf: a thread widens its
// part of C there before the first k block (when beta reads it) and rounds it into C after the
// last. Which thread computes an element, and the order of its sums, do not change its value.
// With `amx`, each thread holds its tiles configured throughout.
template <typename PackPanel, typename Rows>
void blocked_loops(int64_t m, int64_t n, int64_t k, float beta, const COut& out, const PackSizes& ps, void* pack,
                   bool amx, PackPanel pack_panel, Rows rows) {
  char* const apacks = static_cast<char*>(pack) + ps.b_bytes;
  const int64_t mr = ps.mr, mc = ps.mc, kc = ps.kc, nc = ps.nc;  // nc is also cbuf's row stride
#pragma omp parallel num_threads(ps.threads)
  {
    std::optional<AmxTiles> tiles;
    if (amx) tiles.emplace();
    // The grid from the team OpenMP gave (it may give fewer threads than asked for).
    const int threads = omp_get_num_threads();
    int tm = 1;
    for (int d = threads; d > 1; --d)
      if (threads % d == 0 && m >= int64_t{4} * mr * d) {
        tm = d;
        break;
      }
    const int tn = threads / tm;
    const int t = omp_get_thread_num();
    uint32_t* const apack = reinterpret_cast<uint32_t*>(apacks + t * ps.a_bytes);
    const int64_t r0 = split_at(m, tm, t / tn, mr), r1 = split_at(m, tm, t / tn + 1, mr);
    const int64_t chunks = std::max<int64_t>(1, (r1 - r0 + mc - 1) / mc);
    const int64_t chunk = std::min(mc, round_up((r1 - r0 + chunks - 1) / chunks, mr));
    for (int64_t j0 = 0; j0 < n; j0 += nc) {
      const int64_t ncur = std::min(nc, n - j0);
      const int64_t panels = (ncur + kNr - 1) / kNr;
      const int64_t q0 = panels * (t % tn) / tn, q1 = panels * (t % tn + 1) / tn;
      const int64_t cj = q0 * kNr, ccols = std::min(q1 * kNr, ncur) - cj;  // this thread's columns
      for (int64_t p0 = 0; p0 < k; p0 += kc) {
        const int64_t kcur = std::min(kc, k - p0);
        const bool accumulate = p0 > 0 || beta != 0.0f;
        const float bk = p0 > 0 ? 1.0f : beta;
#pragma omp for schedule(static)
        for (int64_t jp = 0; jp < panels; ++jp) pack_panel(jp, j0, p0, kcur);
        for (int64_t i0 = r0; i0 < r1 && q0 < q1; i0 += chunk) {
          const int64_t rn = std::min(chunk, r1 - i0);
          if (out.c16 == nullptr) {
            rows(apack, i0, rn, q0, q1, ncur, out.c + i0 * out.ldc + j0, out.ldc, p0, kcur, accumulate, bk);
            continue;
          }
          float* const cb = out.cbuf + i0 * nc;
          uint16_t* const c16 = out.c16 + i0 * out.ldc + j0;
          if (p0 == 0 && beta != 0.0f) widen_block(cb + cj, nc, c16 + cj, out.ldc, rn, ccols);
          rows(apack, i0, rn, q0, q1, ncur, cb, nc, p0, kcur, accumulate, bk);
          if (p0 + kcur >= k) narrow_block(c16 + cj, out.ldc, cb + cj, nc, rn, ccols);
        }
#pragma omp barrier
      }
    }
  }
}

// ---- fp32 FMAs on the same packs, widened ----
//
// Where VDPBF16PS retires at half the f32 FMAs' rate (Intel's cores), the fastest bf16 GEMM is
// fp32 arithmetic, with the operands widened as they are packed rather than copied whole: each
// panel is packed in pairs as above into the upper half of its fp32 space, then widened in
// place to one fp32 row per k (a bf16 is the upper half of its fp32). The 12 x 32 register
// block runs 24 FMAs per k on one broadcast of A per row and two vectors of B (in L1 this
// block runs at the FMAs' peak). k blocks of 512 and packed blocks of 1024 columns (B's block
// is 2 MiB), rows per thread block as above. On the Xeon above, one thread, against 256 and
// 2048: 148 -> 152 GFLOP/s at (2048, 512, 4096), 135 -> 140 with A transposed at
// (512, 4096, 2048); sgemm 146-151 and 146.
constexpr int64_t kFmaKc = 512;
constexpr int64_t kFmaNc = 1024;

PackSizes fma_pack_sizes(int64_t m, int64_t n, int64_t k, int threads, bool c_bf16) {
  return pack_sizes(m, n, k, threads, c_bf16, kFmaKc, kFmaNc, /*elem_bytes=*/4);
}

// A panel of `width` (kMr or kNr) lanes packed in kp pairs at words [kp * width, 2 kp * width)
// of `panel`, widened in place to 2 kp fp32 rows of `width`: row 2p holds the pairs' lower
// halves, 2p + 1 their upper. Row p of pairs is read whole before rows 2p and 2p + 1 are
// written, and those reach no later row of pairs (2p + 2 <= kp + p + 1).
// (GCC 12 reports _mm512_slli_epi32's unused merge source as maybe uninitialized, as in
// bf16_pack_a_f32 below.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void widen_pairs_in_place(float* panel, int64_t kp, int64_t width) {
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(panel) + kp * width;
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __mmask16 m0 = first_bits16(width), m1 = first_bits16(width - 16);
  for (int64_t p = 0; p < kp; ++p) {
    const __m512i w0 = _mm512_maskz_loadu_epi32(m0, pairs + p * width);
    const __m512i w1 = _mm512_maskz_loadu_epi32(m1, pairs + p * width + 16);
    float* lo = panel + 2 * p * width;
    float* up = lo + width;
    _mm512_mask_storeu_ps(lo, m0, _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)));
    _mm512_mask_storeu_ps(lo + 16, m1, _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)));
    _mm512_mask_storeu_ps(up, m0, _mm512_castsi512_ps(_mm512_and_si512(w0, hi)));
    _mm512_mask_storeu_ps(up + 16, m1, _mm512_castsi512_ps(_mm512_and_si512(w1, hi)));
  }
}
#pragma GCC diagnostic pop

// C[0:rows, 0:cols] = alpha * Apanel Bpanel + (accumulate ? beta * C : 0), fp32 panels of k rows
// (A: 12 values per k, B: 32).
inline void micro_f32(int64_t k, const float* ap, const float* bp, float* c, int64_t ldc, int64_t rows, int64_t cols,
                      float alpha, bool accumulate, float beta) {
  __m512 acc[kMr][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  if (accumulate) prefetch_c(c, ldc, rows);
  for (int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_loadu_ps(bp + p * kNr);
    const __m512 b1 = _mm512_loadu_ps(bp + p * kNr + 16);
    const float* ar = ap + p * kMr;
#pragma GCC unroll 12
    for (int r = 0; r < kMr; ++r) {
      const __m512 x = _mm512_set1_ps(ar[r]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
  }
  store_block(acc, c, ldc, rows, cols, alpha, accumulate, beta);
}

void fma_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
              int64_t lda, const BCols& b, int64_t ldb, float beta, const COut& out, int threads, void* pack) {
  const PackSizes ps = fma_pack_sizes(m, n, k, threads, out.c16 != nullptr);
  float* const bpack = static_cast<float*>(pack);
  auto pack_panel = [&](int64_t jp, int64_t j0, int64_t p0, int64_t kc) {
    const int64_t kp = (kc + 1) / 2;
    float* panel = bpack + jp * 2 * kp * kNr;
    pack_b(reinterpret_cast<uint16_t*>(panel + kp * kNr), trans_b, b, ldb, n, p0, kc, j0 + jp * kNr, 0, kp);
    widen_pairs_in_place(panel, kp, kNr);
  };
  auto rows = [&](uint32_t* apack_words, int64_t i0, int64_t mc, int64_t q0, int64_t q1, int64_t nc, float* c,
                  int64_t ldc, int64_t p0, int64_t kc, bool accumulate, float bk) {
    const int64_t kp = (kc + 1) / 2;
    float* const apack = reinterpret_cast<float*>(apack_words);
    for (int64_t ip = 0; ip * kMr < mc; ++ip) {
      float* panel = apack + ip * 2 * kp * kMr;
      pack_a(reinterpret_cast<uint32_t*>(panel + kp * kMr), trans_a, a, lda, i0 + ip * kMr,
             std::min<int64_t>(kMr, mc - ip * kMr), p0, kc);
      widen_pairs_in_place(panel, kp, kMr);
    }
    for (int64_t jp = q0; jp < q1; ++jp) {
      const float* bp = bpack + jp * 2 * kp * kNr;
      const int64_t cols = std::min<int64_t>(kNr, nc - jp * kNr);
      for (int64_t ip = 0; ip * kMr < mc; ++ip)
        micro_f32(2 * kp, apack + ip * 2 * kp * kMr, bp, c + ip * kMr * ldc + jp * kNr, ldc,
                  std::min<int64_t>(kMr, mc - ip * kMr), cols, alpha, accumulate, bk);
    }
  };
  blocked_loops(m, n, k, beta, out, ps, pack, /*amx=*/false, pack_panel, rows);
}

#if defined(UNTIED_HAVE_AMX)
// ---- AMX: the same GEMM on tile instructions (TDPBF16PS) ----
//
// Loops as above, with kAmxKc along k (a multiple of 32: one tile holds 32 k) and blocks of
// kAmxMc rows per thread; within a thread's block, each 32 rows of A (16 KiB, kept in L1) run
// over every 32-column panel of B in turn (from L2). (The other way round, a B panel in L1 and
// A from L2 with kc 512, a 2048^3 GEMM on one thread ran at about 750 GFLOP/s; this way with
// kc 256, about 860.) A 32 x 32 block of C is amx_block's (amx_block.h): four accumulator
// tiles over the k block's chunks of 32 k, two tiles of A and two of B each. With alpha 1 and
// beta 0 or 1 the accumulators start from C (or zero, for the first k block with beta 0) and are
// stored back into it, so C's traffic is one tile load and store per k block; otherwise the k
// block's sum is added into C as the kernel above does with its registers.
//
// Packed layouts: B as for the kernel above (32-column panels of pairs: a tile is 16 pairs of
// 16 columns, rows 128 bytes apart), with its pairs padded with zeros to a multiple of 16;
// A as tiles of 16 rows x 32 k in a row: [16-row tile][32-k chunk][16 rows][32 k], each tile
// 1 KiB, rows and k past the edges zero. A is always packed: read in place, a tile's 16 rows
// lie lda apart, and with lda a multiple of 4 KiB (E = 4096) they share one set of the L1
// cache; packed, a 2048^3 GEMM on one thread ran at 737 GFLOP/s against 470.
constexpr int64_t kAmxKc = 256;
constexpr int64_t kAmxMc = 256;
constexpr int64_t kAmxNc = 1024;
constexpr int64_t kTileWords = 16 * 16;  // a 16 x 32 bf16 tile in 32-bit words

PackSizes amx_pack_sizes(int64_t m, int64_t n, int64_t k, int threads, bool c_bf16) {
  return pack_sizes(m, n, k, threads, c_bf16, kAmxKc, kAmxNc, /*elem_bytes=*/2, /*k_round=*/32, kAmxMc, /*mr=*/32);
}

// Packs rows [i0, i0 + mc) and k [p0, p0 + kc) of op(A) into tiles (layout above); `chunks`
// 32-k chunks per tile row (ceil(kc / 32)), round_up(mc, 32) rows.
void amx_pack_a_block(uint32_t* dst, bool trans_a, const uint16_t* a, int64_t lda, int64_t i0, int64_t mc,
                      int64_t p0, int64_t kc, int64_t chunks) {
  const int64_t tiles = round_up(mc, 32) / 16;
  if (!trans_a) {  // A is (m, k): a tile row is 32 consecutive k of a row; each row read in order
    for (int64_t i = 0; i < tiles * 16; ++i) {
      uint32_t* out = dst + (i / 16 * chunks) * kTileWords + 16 * (i % 16);
      const uint16_t* src = a + (i0 + i) * lda + p0;
      for (int64_t c = 0; c < chunks; ++c)
        _mm512_storeu_si512(out + c * kTileWords, i < mc ? _mm512_maskz_loadu_epi16(first_bits32(kc - 32 * c), src + 32 * c)
                                                         : _mm512_setzero_si512());
    }
    return;
  }
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rows = std::clamp<int64_t>(mc - 16 * t, 0, 16), r0 = i0 + 16 * t;
    for (int64_t c = 0; c < chunks; ++c) {
      uint32_t* out = dst + (t * chunks + c) * kTileWords;
      const int64_t k0 = p0 + 32 * c, kn = std::min<int64_t>(32, kc - 32 * c);  // k in this chunk
      // A is (k, m): pairs of k rows interleaved for 16 rows (x[q]: pair q of each row), then
      // transposed so that each row's 16 pairs are one vector.
      const __mmask32 rm = first_bits32(rows);
      __m512i x[16];
      for (int64_t q = 0; q < 16; ++q) {
        const __m512i lo =
            2 * q < kn ? _mm512_maskz_loadu_epi16(rm, a + (k0 + 2 * q) * lda + r0) : _mm512_setzero_si512();
        const __m512i hi =
            2 * q + 1 < kn ? _mm512_maskz_loadu_epi16(rm, a + (k0 + 2 * q + 1) * lda + r0) : _mm512_setzero_si512();
        x[q] = _mm512_permutex2var_epi16(lo, kLoPairs, hi);
      }
      transpose16(x);
      for (int64_t r = 0; r < 16; ++r) _mm512_storeu_si512(out + 16 * r, x[r]);
    }
  }
}

void amx_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
              int64_t lda, const BCols& b, int64_t ldb, float beta, const COut& out, int threads, void* pack) {
  const PackSizes ps = amx_pack_sizes(m, n, k, threads, out.c16 != nullptr);
  uint16_t* const bpack = static_cast<uint16_t*>(pack);
  auto chunks_of = [](int64_t kc) { return (kc + 31) / 32; };
  auto pack_panel = [&](int64_t jp, int64_t j0, int64_t p0, int64_t kc) {
    pack_b(bpack, trans_b, b, ldb, n, p0, kc, j0, jp, chunks_of(kc) * 16);
  };
  auto rows = [&](uint32_t* apack, int64_t i0, int64_t mc, int64_t q0, int64_t q1, int64_t nc, float* c, int64_t ldc,
                  int64_t p0, int64_t kc, bool accumulate, float bk) {
    const int64_t chunks = chunks_of(kc);
    amx_pack_a_block(apack, trans_a, a, lda, i0, mc, p0, kc, chunks);
    for (int64_t i = 0; i < mc; i += 32) {
      const char* a0 = reinterpret_cast<const char*>(apack + i / 16 * chunks * kTileWords);
      for (int64_t jp = q0; jp < q1; ++jp) {
        const char* bp = reinterpret_cast<const char*>(bpack + jp * chunks * 16 * kNr * 2);
        const int64_t cols = std::min<int64_t>(kNr, nc - jp * kNr);
        const AmxOperands op{.a0 = a0, .a1 = a0 + chunks * kTileWords * 4, .a_stride = 64, .a_step = kTileWords * 4,
                             .b = bp, .b_stride = kNr * 4, .b_step = 16 * kNr * 4};
        amx_block(chunks, op, c + i * ldc + jp * kNr, ldc, std::min<int64_t>(32, mc - i), cols, alpha,
                  accumulate ? bk : 0.0f);
      }
    }
  };
  blocked_loops(m, n, k, beta, out, ps, pack, /*amx=*/true, pack_panel, rows);
}

#endif  // UNTIED_HAVE_AMX
}  // namespace

bool bf16_gemm_compiled() { return true; }

#if defined(UNTIED_HAVE_DOT_GEMM)
bool bf16_dot_compiled() { return true; }
#else
bool bf16_dot_compiled() { return false; }
#endif

namespace {
#if defined(UNTIED_HAVE_DOT_GEMM)
// The AVX512-BF16 dot-product kernel.
void dot_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
              int64_t lda, const BCols& b, int64_t ldb, float beta, const COut& out, int threads, void* pack) {
  const PackSizes ps = pack_sizes(m, n, k, threads, out.c16 != nullptr);
  uint16_t* const bpack = static_cast<uint16_t*>(pack);
  auto pack_panel = [&](int64_t jp, int64_t j0, int64_t p0, int64_t kc) {
    pack_b(bpack, trans_b, b, ldb, n, p0, kc, j0, jp, (kc + 1) / 2);
  };
  auto rows = [&](uint32_t* apack, int64_t i0, int64_t mc, int64_t q0, int64_t q1, int64_t nc, float* c, int64_t ldc,
                  int64_t p0, int64_t kc, bool accumulate, float bk) {
    const int64_t kp = (kc + 1) / 2;
    pack_a(apack, trans_a, a, lda, i0, mc, p0, kc);
    for (int64_t jp = q0; jp < q1; ++jp) {
      const uint16_t* bp = bpack + jp * kp * kNr * 2;
      const int64_t cols = std::min<int64_t>(kNr, nc - jp * kNr);
      for (int64_t ip = 0; ip * kMr < mc; ++ip)
        micro(kp, apack + ip * kp * kMr, bp, c + ip * kMr * ldc + jp * kNr, ldc, std::min<int64_t>(kMr, mc - ip * kMr),
              cols, alpha, accumulate, bk);
    }
  };
  blocked_loops(m, n, k, beta, out, ps, pack, /*amx=*/false, pack_panel, rows);
}
#endif

// The kernel bf16_gemm runs: the chosen path's; with the widen path chosen (the GEMM dispatch
// then does not call it, but a direct call may), the dot-product kernel, or the fp32 one where
// the build has no dot-product kernel.
Path kernel_path() {
  const Path p = chosen_path();
  if (p == Path::kAmx || p == Path::kFma) return p;
  return bf16_dot_compiled() ? Path::kDot : Path::kFma;
}

PackSizes chosen_pack_sizes(int64_t m, int64_t n, int64_t k, int threads, bool c_bf16) {
#if defined(UNTIED_HAVE_AMX)
  if (kernel_path() == Path::kAmx) return amx_pack_sizes(m, n, k, threads, c_bf16);
#endif
  if (kernel_path() == Path::kFma) return fma_pack_sizes(m, n, k, threads, c_bf16);
  return pack_sizes(m, n, k, threads, c_bf16);
}

// The kernel into C as `out` says (with bf16 C, out.cbuf is set here, after the packs).
void run_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
              int64_t lda, const BCols& b, int64_t ldb, float beta, COut out, int threads, void* pack) {
  if (m <= 0 || n <= 0) return;
  UNTIED_CHECK(k > 0, "bf16_gemm needs k > 0 (the caller defines C = beta C for k = 0)");
  if (out.c16 != nullptr) {
    const PackSizes ps = chosen_pack_sizes(m, n, k, threads, true);
    out.cbuf = reinterpret_cast<float*>(static_cast<char*>(pack) + ps.b_bytes + ps.threads * ps.a_bytes);
  }
  switch (kernel_path()) {
#if defined(UNTIED_HAVE_AMX)
    case Path::kAmx: return amx_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, threads, pack);
#endif
#if defined(UNTIED_HAVE_DOT_GEMM)
    case Path::kDot: return dot_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, threads, pack);
#endif
    case Path::kFma: return fma_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, out, threads, pack);
    default: UNTIED_CHECK(false, "bf16_gemm: no kernel for the chosen path in this build");
  }
}
}  // namespace

int64_t bf16_gemm_pack_bytes(int64_t m, int64_t n, int64_t k, int threads, bool c_bf16) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const PackSizes ps = chosen_pack_sizes(m, n, k, threads, c_bf16);
  return ps.b_bytes + ps.threads * ps.a_bytes + ps.c_bytes;
}

int64_t bf16_gemm_c_block_cols(int64_t n) { return chosen_pack_sizes(1, n, 1, 1, false).nc; }

void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads,
               void* pack, const int64_t* b_group_offsets, int64_t b_group) {
  run_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, BCols{b, b_group_offsets, b_group}, ldb, beta,
           COut{.c = c, .ldc = ldc}, threads, pack);
}

void bf16_gemm_bf16c(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                     int64_t lda, const uint16_t* b, int64_t ldb, float beta, uint16_t* c, int64_t ldc, int threads,
                     void* pack, const int64_t* b_group_offsets, int64_t b_group) {
  run_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, BCols{b, b_group_offsets, b_group}, ldb, beta,
           COut{.c16 = c, .ldc = ldc}, threads, pack);
}

int64_t bf16_packed_a_words(int64_t m, int64_t k) { return (m + kMr - 1) / kMr * kMr * ((k + 1) / 2); }
int64_t bf16_packed_b_words(int64_t n, int64_t k) { return (n + kNr - 1) / kNr * kNr * ((k + 1) / 2); }

void bf16_pack_a(uint32_t* dst, const uint16_t* a, int64_t lda, int64_t m, int64_t k) {
  pack_a(dst, /*trans_a=*/false, a, lda, 0, m, 0, k);
}

namespace {
// Every panel of a tile's B (n, k), from B's rows (trans_b) or from its transpose's.
void pack_tile_b(uint32_t* dst, bool trans_b, const uint16_t* b, int64_t ldb, int64_t n, int64_t k) {
  const int64_t panels = (n + kNr - 1) / kNr;
  for (int64_t jp = 0; jp < panels; ++jp)
    pack_b(reinterpret_cast<uint16_t*>(dst), trans_b, BCols{b}, ldb, n, 0, k, 0, jp, (k + 1) / 2);
}
}  // namespace

void bf16_pack_b(uint32_t* dst, const uint16_t* b, int64_t ldb, int64_t n, int64_t k) {
  pack_tile_b(dst, /*trans_b=*/true, b, ldb, n, k);
}

#if defined(UNTIED_HAVE_DOT_GEMM)
// (GCC 12's widening and shift intrinsics pass an undefined vector as their unused merge source,
// which -Wmaybe-uninitialized reports as a use, as in bf16_simd.h's transpose16.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void bf16_pack_a_f32(uint32_t* dst, bool trans_a, const float* a, int64_t lda, int64_t m, int64_t k) {
  const int64_t kp = (k + 1) / 2, full = k / 2;
  constexpr __mmask16 kPanel = (1u << kMr) - 1;
  for (int64_t ip = 0; ip * kMr < m; ++ip) {
    uint32_t* out = dst + ip * kp * kMr;
    const int64_t rows = std::min<int64_t>(kMr, m - ip * kMr), r0 = ip * kMr;
    if (!trans_a) {  // A is (m, k): each row's pairs are adjacent
      transpose_pairs_f32(out, kMr, kPanel, a + r0 * lda, lda, rows, k);
      continue;
    }
    // A is (k, m): rows 2p and 2p + 1 of 12 rows' values, rounded, make the pairs' lower and
    // upper halves.
    const __mmask16 rm = first_bits16(rows);
    for (int64_t p = 0; p < kp; ++p) {
      const float* src = a + 2 * p * lda + r0;
      const __m512i x0 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(rm, src)));
      const __m512i x1 =
          p < full ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(rm, src + lda)))
                   : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(out + p * kMr, kPanel, _mm512_or_si512(x0, _mm512_slli_epi32(x1, 16)));
    }
  }
}
#pragma GCC diagnostic pop

#else
void bf16_pack_a_f32(uint32_t*, bool, const float*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "bf16_pack_a_f32: this build has no AVX512-BF16 kernel");
}
#endif

void bf16_pack_bt(uint32_t* dst, const uint16_t* bt, int64_t ldbt, int64_t n, int64_t k) {
  pack_tile_b(dst, /*trans_b=*/false, bt, ldbt, n, k);
}

#if defined(UNTIED_HAVE_DOT_GEMM)
void bf16_tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const uint32_t* a_packed, const uint32_t* b_packed,
                    bool accumulate, float* c, int64_t ldc) {
  const int64_t kp = (k + 1) / 2;
  for (int64_t jp = 0; jp * kNr < n; ++jp) {
    const auto* bp = reinterpret_cast<const uint16_t*>(b_packed + jp * kp * kNr);
    const int64_t cols = std::min<int64_t>(kNr, n - jp * kNr);
    for (int64_t ip = 0; ip * kMr < m; ++ip)
      micro(kp, a_packed + ip * kp * kMr, bp, c + ip * kMr * ldc + jp * kNr, ldc, std::min<int64_t>(kMr, m - ip * kMr),
            cols, alpha, accumulate, 1.0f);
  }
}
#else
void bf16_tile_gemm(int64_t, int64_t, int64_t, float, const uint32_t*, const uint32_t*, bool, float*, int64_t) {
  UNTIED_CHECK(false, "bf16_tile_gemm: this build has no AVX512-BF16 kernel");
}
#endif

std::string bf16_gemm_description() {
  switch (chosen_path()) {
    case Path::kAmx: return "amx 32x32";
    case Path::kDot: return "avx512-bf16 " + std::to_string(kMr) + "x" + std::to_string(kNr);
    case Path::kFma: return "avx512 fp32 " + std::to_string(kMr) + "x" + std::to_string(kNr) + " widened in packing";
    case Path::kWiden: break;
  }
  return "none";
}

#else  // no AVX-512 in this build

bool bf16_gemm_compiled() { return false; }
bool bf16_dot_compiled() { return false; }
int64_t bf16_gemm_pack_bytes(int64_t, int64_t, int64_t, int, bool) { return 0; }
int64_t bf16_gemm_c_block_cols(int64_t n) { return n; }
void bf16_gemm(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t, const uint16_t*, int64_t,
               float, float*, int64_t, int, void*, const int64_t*, int64_t) {
  UNTIED_CHECK(false, "bf16_gemm: this build has no AVX-512 kernel (check bf16_gemm_available())");
}
void bf16_gemm_bf16c(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t, const uint16_t*, int64_t,
                     float, uint16_t*, int64_t, int, void*, const int64_t*, int64_t) {
  UNTIED_CHECK(false, "bf16_gemm_bf16c: this build has no AVX-512 kernel (check bf16_gemm_available())");
}
int64_t bf16_packed_a_words(int64_t, int64_t) { return 0; }
int64_t bf16_packed_b_words(int64_t, int64_t) { return 0; }
void bf16_pack_a(uint32_t*, const uint16_t*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "bf16_pack_a: this build has no AVX512-BF16 kernel");
}
void bf16_pack_b(uint32_t*, const uint16_t*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "bf16_pack_b: this build has no AVX512-BF16 kernel");
}
void bf16_pack_a_f32(uint32_t*, bool, const float*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "bf16_pack_a_f32: this build has no AVX512-BF16 kernel");
}
void bf16_pack_bt(uint32_t*, const uint16_t*, int64_t, int64_t, int64_t) {
  UNTIED_CHECK(false, "bf16_pack_bt: this build has no AVX512-BF16 kernel");
}
void bf16_tile_gemm(int64_t, int64_t, int64_t, float, const uint32_t*, const uint32_t*, bool, float*, int64_t) {
  UNTIED_CHECK(false, "bf16_tile_gemm: this build has no AVX512-BF16 kernel");
}
std::string bf16_gemm_description() { return "none"; }

#endif

namespace {

const char* choice_env() { return std::getenv("UNTIED_BF16_GEMM"); }
bool env_is(const char* v) { return choice_env() != nullptr && std::strcmp(choice_env(), v) == 0; }

Path chosen_path() {
  static const Path chosen = [] {
    return bf16_path_for(Bf16Facts{.compiled = bf16_gemm_compiled(),
                                   .dot_compiled = bf16_dot_compiled(),
                                   .amx_usable = amx_usable(),
                                   .amx_cpu = cpu_has_amx(),
                                   .intel = cpu_is_intel(),
                                   .choice = choice_env() == nullptr ? "" : choice_env()});
  }();
  return chosen;
}

}  // namespace

std::string bf16_gemm_choice_error() {
  const char* e = choice_env();
  if (e == nullptr || *e == '\0' || (env_is("kernel") && bf16_dot_compiled()) || env_is("fma") || env_is("widen"))
    return "";
  if (env_is("kernel") && !bf16_dot_compiled())
    return "UNTIED_BF16_GEMM=kernel: this build has no AVX512-BF16 dot-product kernel (the CPU it was built for has "
           "no AVX512-BF16); use fma or widen, or unset it";
  if (env_is("amx")) {
    if (amx_usable()) return "";
    return std::string("UNTIED_BF16_GEMM=amx: ") +
           (!cpu_has_amx() ? "this CPU has no AMX"
            : !amx_compiled() ? "this build has no AMX kernel (build with -march=native on this CPU)"
                                                      : "the operating system refused tile data (Linux 5.16 or later is needed)") +
           "; use kernel, fma or widen, or unset it";
  }
  return std::string("UNTIED_BF16_GEMM=") + e + ": use amx (tile instructions), kernel (the bf16 dot-product "
         "kernel), fma (fp32 FMAs on operands widened in packing) or widen (sgemm on widened operands), or unset it "
         "for the choice by CPU";
}

std::string bf16_gemm_not_chosen_reason() {
  if (!bf16_gemm_compiled()) return "";
  const Path p = chosen_path();
  if (p == Path::kWiden) return "UNTIED_BF16_GEMM=widen";
  if (p != Path::kFma) return "";
  if (env_is("fma")) return "UNTIED_BF16_GEMM=fma";
  if (!bf16_dot_compiled()) return "this build's CPU has no AVX512-BF16 instructions";
  return std::string(cpu_has_amx() ? "this CPU has AMX, which this build or the OS cannot use, and "
                                   : "an Intel CPU without AMX: ") +
         "its bf16 dot-product instruction runs at half the fp32 FMAs' rate; UNTIED_BF16_GEMM=kernel runs it";
}

Bf16Path bf16_path_for(const Bf16Facts& f) {
  const std::string_view c = f.choice;
  if (!f.compiled || c == "widen") return Bf16Path::kWiden;
  if (c == "kernel") return f.dot_compiled ? Bf16Path::kDot : Bf16Path::kWiden;
  if (c == "fma") return Bf16Path::kFma;
  if (f.amx_usable) return Bf16Path::kAmx;  // asked for, or by default
  // Intel's cores retire VDPBF16PS at half the rate of their two fp32 FMA ports (a Xeon of
  // family 6 model 207, one core: 1.3 G/s against 5.3 G/s FMAs, so 83 against 170 GFLOP/s),
  // where AMD's Zen 4 retires it at the FMA's rate (twice its FLOPs). On Intel, with AMX
  // absent (or hidden by a hypervisor) or refused, fp32 FMAs on widened operands are faster.
  // Without AVX512-BF16 (Skylake-SP to Ice Lake), fp32 FMAs are what there is.
  return f.amx_cpu || f.intel || !f.dot_compiled ? Bf16Path::kFma : Bf16Path::kDot;
}

bool bf16_gemm_available() { return chosen_path() != Path::kWiden; }

bool bf16_tile_products_available() { return chosen_path() == Path::kDot; }

bool bf16_tile_products_on_amx() { return chosen_path() == Path::kAmx; }

}  // namespace untied::cpu

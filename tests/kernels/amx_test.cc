// The attention's tile products on AMX (amx.h) against an fp64 triple loop over the operands
// rounded to bf16, over every edge of the tiles: m, n, k across 16, 32 and 64; A packed from
// fp32 (plain and transposed) and from bf16; B from fp32, from bf16, and from its transpose;
// alpha 1 (whole 32 x 32 blocks of C through the tiles) and another alpha; beta 0 over a C full
// of NaN (never read) and beta 1. Tolerance: test::check_gemm, the fp32 dot-product bound.
// Also: fp32 operands are rounded to nearest even as they are packed.
// Skipped where AMX cannot run (a CPU or build without it).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/amx.h"
#include "kernels/test_util.h"
#include "untied/core/dtype.h"

namespace untied::cpu {
namespace {

#define SKIP_WITHOUT_AMX() \
  if (!amx_usable()) GTEST_SKIP() << "AMX does not run here (CPU, build or operating system)"

enum class Source { kF32, kBf16 };

struct Case {
  int64_t m, n, k;
  bool trans_a;     // A given as (k, m) (fp32 sources only)
  Source a_src, b_src;
  bool b_transposed;  // B given as its transpose (n, k) (bf16 sources only)
  float alpha, beta;
};

std::string label(const Case& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " trans_a=" + std::to_string(c.trans_a) + " a_bf16=" + std::to_string(c.a_src == Source::kBf16) +
         " b_bf16=" + std::to_string(c.b_src == Source::kBf16) + " bt=" + std::to_string(c.b_transposed) +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta);
}

// Returns the number of elements out of bound.
int64_t run_case(const Case& c, std::mt19937& gen) {
  std::normal_distribution<float> dist;
  const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
  const int64_t b_rows = c.b_transposed ? c.n : c.k, b_cols = c.b_transposed ? c.k : c.n;
  const int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = c.n + 2;
  // Values exact in bf16 for bf16 sources; arbitrary fp32 otherwise (rounded when packed).
  std::vector<float> a(a_rows * lda), b(b_rows * ldb);
  for (auto& x : a) x = c.a_src == Source::kBf16 ? round_to_bf16(dist(gen)) : dist(gen);
  for (auto& x : b) x = c.b_src == Source::kBf16 ? round_to_bf16(dist(gen)) : dist(gen);
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = float_to_bf16(a[i]).bits;
  for (size_t i = 0; i < b.size(); ++i) b16[i] = float_to_bf16(b[i]).bits;
  std::vector<uint16_t> ap(amx_packed_a_elems(c.m, c.k)), bp(amx_packed_b_elems(c.k, c.n));
  if (c.a_src == Source::kBf16)
    amx_pack_a(ap.data(), a16.data(), lda, c.m, c.k);
  else
    amx_pack_a(ap.data(), c.trans_a, a.data(), lda, c.m, c.k);
  if (c.b_src == Source::kF32)
    amx_pack_b(bp.data(), b.data(), ldb, c.k, c.n);
  else if (c.b_transposed)
    amx_pack_bt(bp.data(), b16.data(), ldb, c.k, c.n);
  else
    amx_pack_b(bp.data(), b16.data(), ldb, c.k, c.n);
  std::vector<float> cc(c.m * ldc);
  for (auto& x : cc) x = c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(gen);
  const std::vector<float> c0 = cc;
  {
    const AmxTiles tiles;
    amx_tile_product(c.m, c.n, c.k, c.alpha, ap.data(), bp.data(), c.beta, cc.data(), ldc);
  }
  // The reference multiplies the operands as packed: rounded to bf16 (exact for bf16 sources).
  auto av = [&](int64_t i, int64_t p) { return double{round_to_bf16(c.trans_a ? a[p * lda + i] : a[i * lda + p])}; };
  auto bv = [&](int64_t p, int64_t j) {
    return double{round_to_bf16(c.b_transposed ? b[j * ldb + p] : b[p * ldb + j])};
  };
  return test::check_gemm(cc, c0, c.m, c.n, c.k, ldc, c.alpha, c.beta, av, bv, label(c));
}

TEST(AmxTile, EveryEdgeOfTheTiles) {
  SKIP_WITHOUT_AMX();
  std::mt19937 gen(21);
  int64_t cases = 0, bad = 0;
  for (int64_t m : {1, 15, 16, 17, 32, 33, 64})
    for (int64_t n : {1, 16, 31, 32, 33, 70})
      for (int64_t k : {1, 2, 31, 32, 33, 128})
        for (float alpha : {1.0f, 0.125f})
          for (float beta : {0.0f, 1.0f}) {
            for (bool ta : {false, true}) {
              bad += run_case({m, n, k, ta, Source::kF32, Source::kF32, false, alpha, beta}, gen);
              ++cases;
            }
            bad += run_case({m, n, k, false, Source::kBf16, Source::kBf16, false, alpha, beta}, gen);
            bad += run_case({m, n, k, false, Source::kBf16, Source::kBf16, true, alpha, beta}, gen);
            cases += 2;
          }
  EXPECT_EQ(bad, 0) << "out of " << cases << " cases";
}

// A read in place (amx_tile_product_rows) gives the packed A's result bit for bit, over whole
// tiles of rows and k, B as the attention packs it, alpha 1 and another, beta 0 and 1; and the
// shapes it cannot take are refused (amx_rows_in_place).
TEST(AmxTile, RowsInPlaceMatchPacked) {
  SKIP_WITHOUT_AMX();
  EXPECT_FALSE(amx_rows_in_place(31, 128, 512));    // a partial tile of rows
  EXPECT_FALSE(amx_rows_in_place(64, 80, 512));     // a partial chunk of k
  EXPECT_FALSE(amx_rows_in_place(64, 128, 2048));   // rows 4 KiB apart: one L1 set
  std::mt19937 gen(5);
  std::normal_distribution<float> dist;
  for (int64_t m : {32, 128})
    for (int64_t n : {1, 33, 128})
      for (int64_t k : {32, 64, 128})
        for (float alpha : {1.0f, 0.25f})
          for (float beta : {0.0f, 1.0f}) {
            const int64_t lda = 4 * k + 8;  // rows of a packed-heads buffer, a few heads wide
            ASSERT_TRUE(amx_rows_in_place(m, k, lda));
            std::vector<uint16_t> a(m * lda), bt(n * k);
            for (auto& x : a) x = float_to_bf16(dist(gen)).bits;
            for (auto& x : bt) x = float_to_bf16(dist(gen)).bits;
            std::vector<uint16_t> ap(amx_packed_a_elems(m, k)), bp(amx_packed_b_elems(k, n));
            amx_pack_a(ap.data(), a.data(), lda, m, k);
            amx_pack_bt(bp.data(), bt.data(), k, k, n);
            std::vector<float> packed(m * n), in_place(m * n);
            for (auto& x : packed) x = dist(gen);
            in_place = packed;
            {
              const AmxTiles tiles;
              amx_tile_product(m, n, k, alpha, ap.data(), bp.data(), beta, packed.data(), n);
              amx_tile_product_rows(m, n, k, alpha, a.data(), lda, bp.data(), beta, in_place.data(), n);
            }
            for (int64_t i = 0; i < m * n; ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(in_place[i]), std::bit_cast<uint32_t>(packed[i]))
                  << "m=" << m << " n=" << n << " k=" << k << " alpha=" << alpha << " beta=" << beta << " at " << i;
          }
}

// fp32 operands are rounded to nearest even as they are packed: 1 + 2^-8 (a tie) rounds to 1,
// 1 + 3 * 2^-8 (a tie) to 1 + 2^-6, and 1 + 2^-8 + 2^-20 up to 1 + 2^-7.
TEST(AmxTile, PackingRoundsToNearestEven) {
  SKIP_WITHOUT_AMX();
  const std::vector<float> vals{1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
                                1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)};
  const std::vector<float> want{1.0f, 1.0f + std::ldexp(1.0f, -6), 1.0f + std::ldexp(1.0f, -7)};
  for (size_t v = 0; v < vals.size(); ++v) {
    // C (1 x 1) = A (1 x 1) B (1 x 1) with B = 1: C is A as packed.
    const float a = vals[v], b = 1.0f;
    std::vector<uint16_t> ap(amx_packed_a_elems(1, 1)), bp(amx_packed_b_elems(1, 1));
    amx_pack_a(ap.data(), false, &a, 1, 1, 1);
    amx_pack_b(bp.data(), &b, 1, 1, 1);
    float c = 0.0f;
    {
      const AmxTiles tiles;
      amx_tile_product(1, 1, 1, 1.0f, ap.data(), bp.data(), 0.0f, &c, 1);
    }
    EXPECT_EQ(c, want[v]) << "packing " << a;
  }
}

}  // namespace
}  // namespace untied::cpu

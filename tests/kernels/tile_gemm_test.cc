// tile_gemm (the attention's own tile kernel) against an fp64 triple loop, over every edge of
// its register blocking: m, n, k from 1 past two blocks, both layouts of A, strides wider than
// the shapes, alpha and beta, and beta = 0 over a C full of NaN (which must not be read).
//
// Tolerance: each element's error <= 2 k FLT_EPSILON x (the sum of |terms| behind it), the
// textbook bound for an fp32 dot product of length k (with FMAs, one rounding per term).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/tile_gemm.h"
#include "kernels/test_util.h"

namespace untied::cpu {
namespace {

struct Case {
  bool trans_a;
  int64_t m, n, k;
  float alpha, beta;
};

// Returns the number of elements out of bound; the first few are reported.
int64_t run_case(const Case& c, std::mt19937& gen) {
  std::normal_distribution<float> dist;
  const int64_t lda = (c.trans_a ? c.m : c.k) + 3, ldb = c.n + 5, ldc = c.n + 2;
  const int64_t a_rows = c.trans_a ? c.k : c.m;
  std::vector<float> a(a_rows * lda), b(c.k * ldb), cc(c.m * ldc);
  for (auto& x : a) x = dist(gen);
  for (auto& x : b) x = dist(gen);
  for (auto& x : cc) x = c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(gen);
  const std::vector<float> c0 = cc;
  tile_gemm(c.trans_a, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, cc.data(), ldc);
  return test::check_gemm(
      cc, c0, c.m, c.n, c.k, ldc, c.alpha, c.beta,
      [&](int64_t i, int64_t p) { return double{c.trans_a ? a[p * lda + i] : a[i * lda + p]}; },
      [&](int64_t p, int64_t j) { return double{b[p * ldb + j]}; },
      "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
          " trans_a=" + std::to_string(c.trans_a));
}

TEST(TileGemm, EveryEdgeOfTheBlocking) {
  std::mt19937 gen(7);
  int64_t cases = 0, bad = 0;
  for (bool ta : {false, true})
    for (int64_t m : {1, 2, 5, 11, 12, 13, 25, 64})
      for (int64_t n : {1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 47, 64, 70})
        for (int64_t k : {1, 2, 9, 64}) {
          bad += run_case({ta, m, n, k, 1.0f, 0.0f}, gen);
          ++cases;
        }
  EXPECT_EQ(bad, 0) << "out of " << cases << " cases";
}

TEST(TileGemm, AlphaAndBeta) {
  std::mt19937 gen(8);
  for (bool ta : {false, true}) {
    EXPECT_EQ(run_case({ta, 128, 128, 128, 0.088f, 1.0f}, gen), 0);
    EXPECT_EQ(run_case({ta, 37, 45, 19, -2.0f, 0.5f}, gen), 0);
    EXPECT_EQ(run_case({ta, 13, 33, 7, 1.0f, -1.0f}, gen), 0);
  }
}

TEST(TileGemm, EmptyShapesWriteNothing) {
  std::vector<float> c(4, 3.0f);
  const float a = 1, b = 1;
  tile_gemm(false, 0, 2, 1, 1.0f, &a, 1, &b, 2, 0.0f, c.data(), 2);
  tile_gemm(true, 2, 0, 1, 1.0f, &a, 2, &b, 1, 0.0f, c.data(), 2);
  for (float x : c) EXPECT_EQ(x, 3.0f);
  // k = 0: C = beta C.
  tile_gemm(false, 2, 2, 0, 1.0f, &a, 1, &b, 2, 0.0f, c.data(), 2);
  for (float x : c) EXPECT_EQ(x, 0.0f);
}

TEST(TileGemm, TransposeTile) {
  const int64_t rows = 19, cols = 13;
  std::vector<float> src(rows * (cols + 1)), dst(cols * (rows + 2), -1.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  transpose_tile(dst.data(), rows + 2, src.data(), cols + 1, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(dst[c * (rows + 2) + r], src[r * (cols + 1) + c]);
  EXPECT_EQ(dst[rows], -1.0f);  // padding untouched
}

TEST(TileGemm, Describes) { EXPECT_FALSE(tile_gemm_description().empty()); }

}  // namespace
}  // namespace untied::cpu

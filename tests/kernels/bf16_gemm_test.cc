// bf16_gemm (AMX or AVX512-BF16, whichever runs: kernels_test runs again under each choice)
// against an fp64 triple loop over the same bf16 values, over every edge of its blocking: m, n,
// k across the register block (12 x 32) and the tiles (16 and 32 rows, 32 k), the thread block
// (144 or 128 rows), the packed k block (512, odd k included) and the packed column block (2048); all four
// layouts of A and B; strides wider than the shapes; alpha and beta; beta = 0 over a C full of
// NaN (which must not be read); 1 to 4 threads, which must give the same bits; C stored in bf16,
// which must hold the fp32 result rounded once.
//
// Tolerance: each element's error <= 2 (k + 2) FLT_EPSILON x (the sum of |terms| behind it), the
// bound for an fp32 dot product of length k: products of two bf16 are exact in fp32.
// Skipped in a build without the kernels (a CPU without AVX-512; the attention's tile products
// without AVX512-BF16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/bf16_simd.h"
#include "kernels/test_util.h"
#include "untied/core/dtype.h"

namespace untied::cpu {
namespace {

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha, beta;
};

struct Pack {
  Pack(const Case& c, int threads, bool c_bf16 = false)
      : bytes(bf16_gemm_pack_bytes(c.m, c.n, c.k, threads, c_bf16)),
        p(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)) {}
  ~Pack() { std::free(p); }
  int64_t bytes;
  void* p;
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& gen) {
  std::normal_distribution<float> dist;
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(dist(gen)).bits;
  return v;
}
double val(uint16_t x) { return bf16_to_float(bf16{x}); }

// Random A and B for a case, stored with strides wider than the shapes (C's too: ldc).
struct Operands {
  Operands(const Case& c, std::mt19937& gen)
      : lda((c.trans_a ? c.m : c.k) + 3),
        ldb((c.trans_b ? c.k : c.n) + 5),
        ldc(c.n + 2),
        a(random_bf16((c.trans_a ? c.k : c.m) * lda, gen)),
        b(random_bf16((c.trans_b ? c.n : c.k) * ldb, gen)) {}
  int64_t lda, ldb, ldc;
  std::vector<uint16_t> a, b;
};

// Returns the number of elements out of bound; the first few are reported. `out` gets C.
int64_t run_case(const Case& c, std::mt19937& gen, int threads, std::vector<float>* out = nullptr) {
  std::normal_distribution<float> dist;
  const Operands ops(c, gen);
  const int64_t lda = ops.lda, ldb = ops.ldb, ldc = ops.ldc;
  const std::vector<uint16_t>& a = ops.a;
  const std::vector<uint16_t>& b = ops.b;
  std::vector<float> cc(c.m * ldc);
  for (auto& x : cc) x = c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(gen);
  const std::vector<float> c0 = cc;
  Pack pack(c, threads);
  bf16_gemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, cc.data(), ldc,
            threads, pack.p);
  const int64_t bad = test::check_gemm(
      cc, c0, c.m, c.n, c.k, ldc, c.alpha, c.beta,
      [&](int64_t i, int64_t p) { return val(c.trans_a ? a[p * lda + i] : a[i * lda + p]); },
      [&](int64_t p, int64_t j) { return val(c.trans_b ? b[j * ldb + p] : b[p * ldb + j]); },
      "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
          " trans_a=" + std::to_string(c.trans_a) + " trans_b=" + std::to_string(c.trans_b));
  if (out != nullptr) *out = cc;
  return bad;
}

#define SKIP_WITHOUT_KERNEL() \
  if (!bf16_gemm_compiled()) GTEST_SKIP() << "this build has no AVX-512 kernel"

TEST(Bf16Gemm, EveryEdgeOfTheRegisterBlock) {
  SKIP_WITHOUT_KERNEL();
  std::mt19937 gen(7);
  int64_t cases = 0, bad = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t m : {1, 5, 11, 12, 13, 16, 17, 25, 31, 32, 33})
        for (int64_t n : {1, 7, 15, 16, 17, 31, 32, 33, 70})
          for (int64_t k : {1, 2, 3, 9, 31, 32, 33, 64}) {
            bad += run_case({ta, tb, m, n, k, 1.0f, 0.0f}, gen, 1);
            ++cases;
          }
  EXPECT_EQ(bad, 0) << "out of " << cases << " cases";
}

TEST(Bf16Gemm, EveryEdgeOfTheCacheBlocks) {
  SKIP_WITHOUT_KERNEL();
  std::mt19937 gen(9);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      EXPECT_EQ(run_case({ta, tb, 145, 40, 513, 1.0f, 0.0f}, gen, 1), 0);   // 2 thread blocks, 2 k blocks, odd k
      EXPECT_EQ(run_case({ta, tb, 129, 33, 545, 1.0f, 0.0f}, gen, 2), 0);   // the same for AMX's blocks
      EXPECT_EQ(run_case({ta, tb, 30, 2049, 20, 1.0f, 0.0f}, gen, 2), 0);   // 2 column blocks
      EXPECT_EQ(run_case({ta, tb, 300, 65, 1100, 0.5f, 1.0f}, gen, 3), 0);   // beta with 3 k blocks
    }
}

TEST(Bf16Gemm, AlphaAndBeta) {
  SKIP_WITHOUT_KERNEL();
  std::mt19937 gen(8);
  for (bool ta : {false, true}) {
    EXPECT_EQ(run_case({ta, true, 128, 128, 128, 0.088f, 1.0f}, gen, 1), 0);
    EXPECT_EQ(run_case({ta, false, 37, 45, 19, -2.0f, 0.5f}, gen, 1), 0);
    EXPECT_EQ(run_case({ta, true, 13, 33, 7, 1.0f, -1.0f}, gen, 1), 0);
  }
}

TEST(Bf16Gemm, ThreadCountDoesNotChangeTheBits) {
  SKIP_WITHOUT_KERNEL();
  std::vector<float> one, three;
  std::mt19937 g1(11), g3(11);
  EXPECT_EQ(run_case({false, true, 500, 300, 1030, 1.0f, 0.0f}, g1, 1, &one), 0);
  EXPECT_EQ(run_case({false, true, 500, 300, 1030, 1.0f, 0.0f}, g3, 3, &three), 0);
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); ++i)
    if (!(one[i] == three[i] || (std::isnan(one[i]) && std::isnan(three[i])))) {
      ADD_FAILURE() << "element " << i << ": " << one[i] << " with 1 thread, " << three[i] << " with 3";
      break;
    }
}

// The threads split C into a grid of row groups and, when the rows are few, column groups: every
// grid (1 to 6 threads; few rows, rows not a multiple of the blocks, 2 column blocks, 2 x 3)
// gives the bits of one thread (and the fp64 check of run_case finds any part left out).
TEST(Bf16Gemm, EveryThreadGridGivesTheSameBits) {
  SKIP_WITHOUT_KERNEL();
  for (const Case& c : {Case{false, true, 30, 300, 100, 1.0f, 0.0f}, Case{true, false, 292, 1100, 600, 1.0f, 0.5f},
                        Case{false, false, 13, 2100, 33, 2.0f, 0.0f}, Case{true, true, 1, 40, 9, 1.0f, 1.0f},
                        Case{false, true, 100, 200, 70, 1.0f, 0.0f}}) {
    std::vector<float> one;
    std::mt19937 g1(21);
    EXPECT_EQ(run_case(c, g1, 1, &one), 0);
    for (int threads : {2, 3, 4, 6}) {  // m = 100 on 6 threads: 2 row groups by 3 column groups
      std::vector<float> more;
      std::mt19937 g(21);
      EXPECT_EQ(run_case(c, g, threads, &more), 0);
      ASSERT_EQ(one.size(), more.size());
      int64_t differ = 0;
      for (size_t i = 0; i < one.size(); ++i)
        differ += !(one[i] == more[i] || (std::isnan(one[i]) && std::isnan(more[i])));
      EXPECT_EQ(differ, 0) << "m=" << c.m << " n=" << c.n << " k=" << c.k << ", " << threads << " threads";
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The vector rounding of bf16 C against float_to_bf16, value by value: NaNs with payload bits
// only below bit 16 (must stay NaN), infinities, the largest finite values (round to infinity or
// not), ties to even, subnormals (kept, not flushed), signed zeros; masked lanes untouched.
TEST(Bf16Gemm, VectorRoundingIsFloatToBf16) {
  const uint32_t bits[16] = {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
                             0x7f7f7fffu, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x00000001u, 0x807fffffu,
                             0x00008000u, 0x00018000u, 0x80000000u, 0x00000000u};
  float in[16];
  std::memcpy(in, bits, sizeof in);
  uint16_t out[17];
  std::fill(out, out + 17, uint16_t{0xABCD});
  store_bf16_rounded(out, 0xFFFF, _mm512_loadu_ps(in));
  for (int i = 0; i < 16; ++i) {
    const uint16_t want = float_to_bf16(in[i]).bits;
    EXPECT_EQ(out[i], want) << std::hex << "input 0x" << bits[i];
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(bf16_to_float(bf16{out[i]}))) << std::hex << "input 0x" << bits[i];
    }
  }
  EXPECT_EQ(out[16], 0xABCD);
  store_bf16_rounded(out, 0x0001, _mm512_set1_ps(2.0f));  // one lane
  EXPECT_EQ(out[0], float_to_bf16(2.0f).bits);
  EXPECT_EQ(out[1], float_to_bf16(in[1]).bits);
  uint32_t w[16];  // and back: widening is exact, lanes past the mask zero
  _mm512_storeu_ps(reinterpret_cast<float*>(w), load_bf16_widened(out, 0x7FFF));
  for (int i = 0; i < 15; ++i) EXPECT_EQ(w[i], static_cast<uint32_t>(out[i]) << 16) << "lane " << i;
  EXPECT_EQ(w[15], 0u);
}
#endif

// With C stored in bf16: each element is bf16_gemm's fp32 result (beta applied to C widened),
// rounded once as float_to_bf16 rounds, bit for bit; elements past n in each row untouched. The
// values include NaN and infinity (from A) and subnormal results (a tiny alpha).
TEST(Bf16Gemm, Bf16OutputIsTheFp32ResultRoundedOnce) {
  SKIP_WITHOUT_KERNEL();
  std::mt19937 gen(31);
  int64_t differ = 0, cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Case& c : {Case{ta, tb, 1, 1, 1, 1.0f, 0.0f}, Case{ta, tb, 13, 33, 7, 1.0f, 1.0f},
                            Case{ta, tb, 145, 1100, 513, 0.5f, 0.0f}, Case{ta, tb, 40, 2049, 20, -1.0f, 0.5f},
                            Case{ta, tb, 25, 70, 33, 1e-39f, 0.0f}})
        for (int threads : {1, 3}) {
          Operands ops(c, gen);
          const int64_t lda = ops.lda, ldb = ops.ldb, ldc = ops.ldc;
          std::vector<uint16_t>& a = ops.a;
          const std::vector<uint16_t>& b = ops.b;
          if (c.m > 2 && c.k > 1) {  // row 1 of op(A): a NaN; row 2: an infinity
            a[c.trans_a ? 0 * lda + 1 : 1 * lda + 0] = 0x7fc0;
            a[c.trans_a ? 1 * lda + 2 : 2 * lda + 1] = 0x7f80;
          }
          const std::vector<uint16_t> c16_0 = random_bf16(c.m * ldc, gen);
          std::vector<float> c32(c.m * ldc);
          for (size_t i = 0; i < c32.size(); ++i) c32[i] = val(c16_0[i]);
          std::vector<uint16_t> c16 = c16_0;
          Pack p32(c, threads), p16(c, threads, /*c_bf16=*/true);
          bf16_gemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, c32.data(), ldc,
                    threads, p32.p);
          bf16_gemm_bf16c(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta,
                          c16.data(), ldc, threads, p16.p);
          for (int64_t i = 0; i < c.m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const uint16_t want = j < c.n ? float_to_bf16(c32[i * ldc + j]).bits : c16_0[i * ldc + j];
              if (c16[i * ldc + j] != want && differ++ < 5)
                ADD_FAILURE() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << ta << " tb=" << tb
                              << " threads=" << threads << " C(" << i << ", " << j << "): " << std::hex
                              << c16[i * ldc + j] << " want " << want;
            }
          ++cases;
        }
  EXPECT_EQ(differ, 0) << "out of " << cases << " cases";
}

// The attention's tile product: C = alpha A B^T (+ C) on packed tiles, A (m, k) and B (n, k)
// both stored with k along their rows, row strides wider than k, every edge of the panels.
TEST(Bf16Gemm, TileProductOnPackedTiles) {
  if (!bf16_dot_compiled()) GTEST_SKIP() << "this build has no AVX512-BF16 kernel";
  std::mt19937 gen(12);
  std::normal_distribution<float> dist;
  int64_t bad = 0;
  for (int64_t m : {1, 12, 13, 128})
    for (int64_t n : {1, 31, 32, 33, 128})
      for (int64_t k : {1, 7, 64, 128})
        for (bool acc : {false, true}) {
          const int64_t lda = k + 3, ldb = k + 5, ldc = n + 1;
          const std::vector<uint16_t> a = random_bf16(m * lda, gen), b = random_bf16(n * ldb, gen);
          std::vector<float> c(m * ldc);
          for (auto& x : c) x = acc ? dist(gen) : std::numeric_limits<float>::quiet_NaN();
          const std::vector<float> c0 = c;
          std::vector<uint32_t> ap(bf16_packed_a_words(m, k)), bp(bf16_packed_b_words(n, k));
          bf16_pack_a(ap.data(), a.data(), lda, m, k);
          bf16_pack_b(bp.data(), b.data(), ldb, n, k);
          const float alpha = 0.125f;
          bf16_tile_gemm(m, n, k, alpha, ap.data(), bp.data(), acc, c.data(), ldc);
          bad += test::check_gemm(
              c, c0, m, n, k, ldc, alpha, acc ? 1.0f : 0.0f, [&](int64_t i, int64_t p) { return val(a[i * lda + p]); },
              [&](int64_t p, int64_t j) { return val(b[j * ldb + p]); },
              "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                  " accumulate=" + std::to_string(acc));
        }
  EXPECT_EQ(bad, 0);
}

TEST(Bf16Gemm, Describes) { EXPECT_FALSE(bf16_gemm_description().empty()); }

// The choice of kernel from what the CPU, the build, the OS and UNTIED_BF16_GEMM say: AMX where
// usable; else fp32 FMAs on Intel's CPUs (the dot-product instruction runs at half rate there, or
// is absent) and the dot-product kernel on others; an explicit choice over all of them.
TEST(Bf16Gemm, PathFollowsTheCpu) {
  const Bf16Facts amd{.compiled = true, .dot_compiled = true};
  EXPECT_EQ(bf16_path_for(amd), Bf16Path::kDot);
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true, .dot_compiled = true, .intel = true}), Bf16Path::kFma);  // AMX hidden
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true, .dot_compiled = true, .amx_cpu = true, .intel = true}),
            Bf16Path::kFma);
  EXPECT_EQ(bf16_path_for(Bf16Facts{
                .compiled = true, .dot_compiled = true, .amx_usable = true, .amx_cpu = true, .intel = true}),
            Bf16Path::kAmx);
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true, .dot_compiled = true, .intel = true, .choice = "kernel"}),
            Bf16Path::kDot);
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true, .dot_compiled = true, .amx_usable = true, .choice = "kernel"}),
            Bf16Path::kDot);
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true, .dot_compiled = true, .amx_usable = true, .choice = "widen"}),
            Bf16Path::kWiden);
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true, .dot_compiled = true, .choice = "widen"}), Bf16Path::kWiden);
  EXPECT_EQ(bf16_path_for(Bf16Facts{.choice = "kernel"}), Bf16Path::kWiden);  // nothing compiled in
  // AVX-512 without AVX512-BF16 (Skylake-SP to Ice Lake, or a build for them): fp32 FMAs, on any vendor.
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true, .intel = true}), Bf16Path::kFma);
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true}), Bf16Path::kFma);
  EXPECT_EQ(bf16_path_for(Bf16Facts{.compiled = true, .choice = "fma"}), Bf16Path::kFma);
}

}  // namespace
}  // namespace untied::cpu

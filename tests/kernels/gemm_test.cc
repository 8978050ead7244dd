// GEMM (CPU, BLAS) against the naive fp64 reference (reference.h).
//
// Tolerances (test_util.h): baseline = error of the naive fp32 triple loop on the same inputs
// (and, for bf16 C, the error of rounding the exact result to bf16 if larger); err(kernel) <=
// 4 x baseline + 2 FLT_EPSILON x max over C of |alpha| |A||B| + |beta C| (the sum of |terms|
// behind an element). BLAS sums in blocks with FMAs, which changes the rounding pattern but not
// its growth; bf16 A/B are widened exactly, so they add no error of their own. A bf16 C must in
// addition be the fp32 result rounded once (expect_rounded_once).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/bf16_gemm.h"
#include "kernels/reference.h"
#include "kernels/test_util.h"
#include "untied/core/allocator.h"
#include "untied/core/check.h"
#include "untied/device/device.h"
#include "untied/kernels/gemm.h"

namespace untied {
namespace {

using test::expect_close;
using test::make_budget;
using test::Stored;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct GemmCase {
  std::string name;
  bool trans_a = false, trans_b = false;
  int64_t m, n, k;
  float alpha = 1.0f, beta = 0.0f;
  DType a_dtype = DType::kF32, b_dtype = DType::kF32, c_dtype = DType::kF32;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // ld = stored row length + pad
};

std::ostream& operator<<(std::ostream& os, const GemmCase& c) { return os << c.name; }

std::unique_ptr<Device> cpu() { return make_cpu_device(CpuDeviceOptions{.threads = 2}); }

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }
std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// The stored matrices of a case and their dense copies.
struct GemmProblem {
  int64_t a_rows, a_cols, b_rows, b_cols;
  Stored a, b, c;
  std::vector<double> a_dense, b_dense, c0;  // c0: C before the call (NaN when beta == 0)

  explicit GemmProblem(const GemmCase& t, uint64_t seed = 17)
      : a_rows(t.trans_a ? t.k : t.m), a_cols(t.trans_a ? t.m : t.k),
        b_rows(t.trans_b ? t.n : t.k), b_cols(t.trans_b ? t.k : t.n),
        a(t.a_dtype, a_rows, a_cols, a_cols + t.pad_a, Stored::Pad::kNaN),
        b(t.b_dtype, b_rows, b_cols, b_cols + t.pad_b, Stored::Pad::kNaN),
        c(t.c_dtype, t.m, t.n, t.n + t.pad_c, Stored::Pad::kSentinel) {
    test::Rng rng(seed);
    a_dense = test::random_values(rng, a_rows * a_cols, t.a_dtype);
    b_dense = test::random_values(rng, b_rows * b_cols, t.b_dtype);
    c0 = test::random_values(rng, t.m * t.n, t.c_dtype);
    if (t.beta == 0.0f)
      for (auto& x : c0) x = kNaN;  // beta = 0 overwrites: old NaNs must not leak through
    a.set(a_dense);
    b.set(b_dense);
    c.set(c0);
  }

  GemmParams params(const GemmCase& t) {
    return GemmParams{.trans_a = t.trans_a, .trans_b = t.trans_b, .m = t.m, .n = t.n, .k = t.k,
                      .alpha = t.alpha, .beta = t.beta, .a = a.data(), .lda = a_cols + t.pad_a,
                      .a_dtype = t.a_dtype, .b = b.data(), .ldb = b_cols + t.pad_b,
                      .b_dtype = t.b_dtype, .c = c.data(), .ldc = t.n + t.pad_c,
                      .c_dtype = t.c_dtype};
  }
};

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cs;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string tr = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      cs.push_back({.name = tr + "_beta0", .trans_a = ta, .trans_b = tb, .m = 37, .n = 53,
                    .k = 71});
      cs.push_back({.name = tr + "_beta1_alpha_ld", .trans_a = ta, .trans_b = tb, .m = 37,
                    .n = 53, .k = 71, .alpha = -0.75f, .beta = 1.0f, .pad_a = 5, .pad_b = 3,
                    .pad_c = 7});
      cs.push_back({.name = tr + "_bf16_ab", .trans_a = ta, .trans_b = tb, .m = 29, .n = 41,
                    .k = 64, .alpha = 0.5f, .beta = 1.0f, .a_dtype = DType::kBF16,
                    .b_dtype = DType::kBF16, .pad_a = 2, .pad_c = 1});
      cs.push_back({.name = tr + "_bf16_all_beta0", .trans_a = ta, .trans_b = tb, .m = 40,
                    .n = 24, .k = 33, .a_dtype = DType::kBF16, .b_dtype = DType::kBF16,
                    .c_dtype = DType::kBF16, .pad_b = 9});
    }
  cs.push_back({.name = "bf16_a_only", .trans_b = true, .m = 31, .n = 17, .k = 50,
                .a_dtype = DType::kBF16});
  cs.push_back({.name = "bf16_b_only", .trans_a = true, .m = 31, .n = 17, .k = 50,
                .alpha = 2.0f, .beta = 1.0f, .b_dtype = DType::kBF16});
  cs.push_back({.name = "bf16_c_accumulate", .m = 20, .n = 70, .k = 90, .alpha = 1.5f,
                .beta = 1.0f, .c_dtype = DType::kBF16, .pad_c = 6});
  cs.push_back({.name = "beta_minus_half", .trans_a = true, .trans_b = true, .m = 25, .n = 19,
                .k = 47, .alpha = 0.25f, .beta = -0.5f});
  cs.push_back({.name = "large_blocked", .m = 256, .n = 256, .k = 256});
  cs.push_back({.name = "row_vector", .m = 1, .n = 64, .k = 100, .beta = 1.0f});
  cs.push_back({.name = "column_vector", .trans_a = true, .m = 64, .n = 1, .k = 100});
  return cs;
}

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesReference) {
  const GemmCase& t = GetParam();
  GemmProblem p(t);
  auto dev = cpu();
  gemm(*dev, p.params(t));

  const int64_t lda = p.a_cols, ldb = p.b_cols, ldc = t.n;  // dense copies
  std::vector<double> c64 = p.c0;
  ref::gemm<double>(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, p.a_dense, lda, p.b_dense, ldb,
                    t.beta, c64, ldc);
  std::vector<float> c32 = to_float(p.c0);
  ref::gemm<float>(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, to_float(p.a_dense), lda,
                   to_float(p.b_dense), ldb, t.beta, c32, ldc);
  // Sum of |terms| behind each element: the same product on absolute values.
  auto abs_of = [](std::vector<double> x) {
    for (double& e : x) e = std::fabs(e);
    return x;
  };
  std::vector<double> c_mag = t.beta == 0.0f ? std::vector<double>(p.c0.size(), 0.0) : abs_of(p.c0);
  ref::gemm<double>(t.trans_a, t.trans_b, t.m, t.n, t.k, std::fabs(t.alpha), abs_of(p.a_dense),
                    lda, abs_of(p.b_dense), ldb, std::fabs(t.beta), c_mag, ldc);
  EXPECT_TRUE(expect_close("C", p.c.get(), c64,
                           make_budget(c64, to_double(c32), t.c_dtype, test::max_abs(c_mag)),
                           {t.m, t.n}));
  if (t.c_dtype == DType::kBF16) {  // "bf16 C is computed in f32 and rounded once"
    EXPECT_TRUE(test::expect_rounded_once(
        "C", p.c.get(), c64,
        make_budget(c64, to_double(c32), DType::kF32, test::max_abs(c_mag)), {t.m, t.n}));
  }
  EXPECT_EQ(p.c.padding_changed(), 0) << "gemm wrote into C's row padding (ldc > n)";
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmTest, ::testing::ValuesIn(gemm_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- degenerate sizes ---------------------------------------------------------------------

// k = 0: op(A) op(B) is the zero matrix, so C = beta * C exactly (beta = 0: zeros even over NaN).
TEST(Gemm, EmptyInnerDimensionGivesBetaTimesC) {
  auto dev = cpu();
  for (DType ct : {DType::kF32, DType::kBF16})
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      SCOPED_TRACE(std::string(dtype_name(ct)) + " beta " + std::to_string(beta));
      GemmCase t{.name = "k0", .m = 6, .n = 5, .k = 0, .alpha = 1.0f, .beta = beta,
                 .c_dtype = ct, .pad_a = 1, .pad_c = 3};  // lda = 1 >= k, as BLAS wants
      GemmProblem p(t);
      gemm(*dev, p.params(t));
      const std::vector<double> got = p.c.get();
      int64_t wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double want = beta == 0.0f ? 0.0 : beta * p.c0[i];  // exact: power-of-2 betas
        if (got[i] != want) {
          if (wrong < 5) ADD_FAILURE() << "C[" << i << "] = " << got[i] << ", want " << want;
          ++wrong;
        }
      }
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(p.c.padding_changed(), 0);
    }
}

// m = 0 or n = 0: C is empty; nothing may be written (here: the buffer behind the pointer).
TEST(Gemm, EmptyOutputIsANoOp) {
  auto dev = cpu();
  for (auto [m, n] : {std::pair<int64_t, int64_t>{0, 5}, {4, 0}, {0, 0}}) {
    SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n));
    std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 7.0f);
    GemmParams p{.m = m, .n = n, .k = 3, .beta = 0.0f, .a = a.data(), .lda = 3, .b = b.data(),
                 .ldb = std::max<int64_t>(n, 1), .c = c.data(), .ldc = std::max<int64_t>(n, 1)};
    EXPECT_NO_THROW(gemm(*dev, p));
    for (float x : c) ASSERT_EQ(x, 7.0f) << "gemm with an empty C wrote memory";
  }
}

// bf16 A/B are widened in scratch (or packed for the bf16 kernel) from the device allocator,
// under the caller's tag, exactly cpu_gemm_scratch_bytes of it, released before gemm returns.
TEST(Gemm, Bf16ScratchUsesTheGivenTagAndIsReleased) {
  auto dev = cpu();
  GemmCase t{.name = "scratch", .m = 32, .n = 48, .k = 64, .a_dtype = DType::kBF16,
             .b_dtype = DType::kBF16};
  GemmProblem p(t);
  GemmParams params = p.params(t);
  params.scratch_tag = Tag::kAttnWorkspace;
  dev->allocator().reset_peaks();
  gemm(*dev, params);
  const MemoryStats st = dev->allocator().stats();
  const int tag = static_cast<int>(Tag::kAttnWorkspace);
  EXPECT_GT(st.peak[tag], 0) << "no scratch under the tag";
  EXPECT_EQ(st.peak[tag], cpu_gemm_scratch_bytes(params, dev->threads()));
  if (!cpu::bf16_gemm_available()) {
    EXPECT_GE(st.peak[tag], (32 * 64 + 64 * 48) * 4) << "A and B widened to fp32";
  }
  EXPECT_EQ(st.live[tag], 0) << "scratch still live after gemm";
  EXPECT_EQ(st.peak[static_cast<int>(Tag::kOther)], 0) << "scratch went to a different tag";
}

// op(B)'s columns gathered from groups of a larger matrix as the GEMM reads them
// (GemmParams::b_group_offsets: a stage's heads, read from the projection's weights) against the
// same GEMM on a copy of those columns: the same values in the same places, the same shapes, so
// the same bits, for every operand type, with and without trans_b, on every CPU path (the bf16
// kernels' packing, and fp32 widening for BLAS). Wrong offsets would put another head's values in
// whole groups of columns.
TEST(Gemm, GatheredBColumnsEqualACopyOfThem) {
  auto dev = cpu();
  const int64_t heads = 7, d = 32, e = 70, m = 45;
  const std::vector<int64_t> picked = {4, 1, 6, 3};  // not consecutive
  const int64_t n = static_cast<int64_t>(picked.size()) * d;
  for (DType t : {DType::kF32, DType::kBF16})
    for (DType ct : {DType::kF32, DType::kBF16})
      for (bool trans_b : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " operands, " + std::string(dtype_name(ct)) + " C, " +
                     (trans_b ? "B = w (heads d, e): rows" : "B = w (e, heads d): columns"));
        test::Rng rng(5);
        // w (heads d, e) with trans_b (a projection's weights), else (e, heads d) (wo).
        const int64_t w_rows = trans_b ? heads * d : e, w_cols = trans_b ? e : heads * d;
        Stored w(t, w_rows, w_cols, w_cols, Stored::Pad::kNaN), x(t, m, e, e, Stored::Pad::kNaN);
        const std::vector<double> w_dense = test::random_values(rng, w_rows * w_cols, t);
        w.set(w_dense);
        x.set(test::random_values(rng, m * e, t));
        // The copy: op(B) (e, n) as B (n, e) with trans_b, else B (e, n).
        const int64_t c_rows = trans_b ? n : e, c_cols = trans_b ? e : n;
        std::vector<double> copy_dense(static_cast<size_t>(c_rows * c_cols));
        std::vector<int64_t> offsets;
        for (size_t g = 0; g < picked.size(); ++g) {
          offsets.push_back(trans_b ? picked[g] * d * e : picked[g] * d);
          for (int64_t j = 0; j < d; ++j)
            for (int64_t r = 0; r < e; ++r) {
              const int64_t col = static_cast<int64_t>(g) * d + j, src_col = picked[g] * d + j;
              if (trans_b) copy_dense[col * e + r] = w_dense[src_col * e + r];
              else copy_dense[r * n + col] = w_dense[r * heads * d + src_col];
            }
        }
        Stored copy(t, c_rows, c_cols, c_cols, Stored::Pad::kNaN), c_gathered(ct, m, n, n, Stored::Pad::kSentinel),
            c_copied(ct, m, n, n, Stored::Pad::kSentinel);
        copy.set(copy_dense);
        const GemmParams base{.trans_b = trans_b, .m = m, .n = n, .k = e, .a = x.data(), .lda = e, .a_dtype = t,
                              .b_dtype = t, .c_dtype = ct};
        GemmParams gathered = base, copied = base;
        gathered.b = w.data(), gathered.ldb = w_cols, gathered.c = c_gathered.data(), gathered.ldc = n;
        gathered.b_group_offsets = offsets.data(), gathered.b_group = d;
        copied.b = copy.data(), copied.ldb = c_cols, copied.c = c_copied.data(), copied.ldc = n;
        gemm(*dev, gathered);
        gemm(*dev, copied);
        EXPECT_TRUE(test::expect_same_values("gathered against copied", c_gathered.get(), c_copied.get()));
      }
}

// ---- bad input ----------------------------------------------------------------------------

void expect_invalid(Device& dev, const GemmParams& p, const std::string& field) {
  SCOPED_TRACE("field " + field);
  try {
    gemm(dev, p);
    ADD_FAILURE() << "gemm accepted a bad " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
        << "message does not name `" << field << "`: " << e.what();
  }
}

TEST(GemmValidate, RejectsBadParamsNamingTheField) {
  auto dev = cpu();
  std::vector<float> a(256, 1.0f), b(256, 1.0f), c(256, 0.0f);
  const GemmParams good{.m = 4, .n = 5, .k = 6, .a = a.data(), .lda = 6, .b = b.data(),
                        .ldb = 5, .c = c.data(), .ldc = 5};
  EXPECT_NO_THROW(gemm(*dev, good));
  auto with = [&](auto edit) {
    GemmParams p = good;
    edit(p);
    return p;
  };
  expect_invalid(*dev, with([](GemmParams& p) { p.m = -1; }), "m");
  expect_invalid(*dev, with([](GemmParams& p) { p.n = -1; }), "n");
  expect_invalid(*dev, with([](GemmParams& p) { p.k = -1; }), "k");
  expect_invalid(*dev, with([](GemmParams& p) { p.lda = 5; }), "lda");          // A (4, 6)
  expect_invalid(*dev, with([](GemmParams& p) { p.trans_a = true; p.lda = 3; }), "lda");  // (6, 4)
  expect_invalid(*dev, with([](GemmParams& p) { p.ldb = 4; }), "ldb");          // B (6, 5)
  expect_invalid(*dev, with([](GemmParams& p) { p.ldc = 4; }), "ldc");          // C (4, 5)
  static const int64_t offsets[1] = {0};  // op(B) gathered in groups that are not 32 columns
  expect_invalid(*dev, with([](GemmParams& p) { p.b_group_offsets = offsets, p.b_group = 5; }), "b_group");
  // A bad operand type: only the kind is checked (the message names the type, "f64").
  try {
    gemm(*dev, with([](GemmParams& p) { p.c_dtype = DType::kF64; }));
    ADD_FAILURE() << "gemm accepted an f64 C";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
  }
}

// bf16 operands are widened in row blocks (A and C rows, or the reduction's rows with
// transposed A) of at most 16 MiB, or multiplied by the bf16 kernel in its own blocks: shapes
// above that must give what fp32 operands holding the same values give. Each is compared with
// fp64 on the same values: the bf16 operands' error must be at most twice BLAS's own (the
// blocked reductions reassociate fp32 sums of k = 70000 terms), plus 1e-6 of max |C|. Two kinds
// of data: random (normal), and periodic (sin and cos of the index), whose rounding errors
// correlate along k. Measured on the periodic data with transposed A, in units of 1e-6 of
// max |C| = 1.70: BLAS 4.7, widening 4.9, the dot-product kernel 4.8, AMX 10.6.
//
// AMX on the periodic data is allowed 3x BLAS: the tile instruction sums each 32 products in an
// order and with an internal rounding of its own (left to the implementation), and on this data
// its errors per 32 k add up along k: their sum alone, the instruction run one 32-k step at a
// time from zero, is 1.79e-5 (the same with the steps summed in fp32 every 32, 64, 128 or 512
// k), against 0.64e-5 for pairs summed in order with round to nearest. On random data its error
// is the smallest of the four paths (0.29e-3 against BLAS's 0.42e-3 at max |C| 1050), and there
// every path is held to 2x BLAS.
TEST(Gemm, TiledWideningMatchesFp32Operands) {
  auto dev = cpu();
  const bool amx = cpu::bf16_gemm_description().rfind("amx", 0) == 0;
  for (bool random : {false, true}) {
    for (bool trans_a : {false, true}) {
      const int64_t big = 70000, small = 64, n = 16;  // big * small * 4 bytes > 16 MiB: two blocks
      const int64_t m = trans_a ? small : big, k = trans_a ? big : small;
      std::vector<float> a(m * k), b(k * n);
      std::mt19937 gen(5);
      std::normal_distribution<float> dist;
      for (size_t i = 0; i < a.size(); ++i) a[i] = round_to_bf16(random ? dist(gen) : std::sin(0.37 * i));
      for (size_t i = 0; i < b.size(); ++i) b[i] = round_to_bf16(random ? dist(gen) : std::cos(0.11 * i));
      std::vector<bf16> a16(a.size()), b16(b.size());
      for (size_t i = 0; i < a.size(); ++i) a16[i] = float_to_bf16(a[i]);
      for (size_t i = 0; i < b.size(); ++i) b16[i] = float_to_bf16(b[i]);
      std::vector<float> c32(m * n), c16(m * n);
      const int64_t lda = trans_a ? m : k;
      GemmParams p{.trans_a = trans_a, .m = m, .n = n, .k = k, .a = a.data(), .lda = lda, .b = b.data(), .ldb = n,
                   .c = c32.data(), .ldc = n};
      gemm(*dev, p);
      p.a = a16.data(), p.a_dtype = DType::kBF16, p.b = b16.data(), p.b_dtype = DType::kBF16, p.c = c16.data();
      gemm(*dev, p);
      double mx = 0, e32 = 0, e16 = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0;
          for (int64_t r = 0; r < k; ++r) ref += double{trans_a ? a[r * lda + i] : a[i * lda + r]} * b[r * n + j];
          e32 = std::max(e32, std::fabs(c32[i * n + j] - ref));
          e16 = std::max(e16, std::fabs(c16[i * n + j] - ref));
          mx = std::max(mx, std::fabs(ref));
        }
      const double times = amx && !random ? 3 : 2;
      EXPECT_LE(e16, times * e32 + 1e-6 * mx)
          << (random ? "random, " : "periodic, ") << (trans_a ? "transposed A" : "plain") << ": bf16 operands err "
          << e16 << ", fp32 operands err " << e32 << " (max |C| " << mx << ")";
    }
  }
}

}  // namespace
}  // namespace untied

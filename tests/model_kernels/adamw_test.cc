// AdamW and the clipping helpers (CPU) against the fp64 formula (model_reference.h).
//
// Tolerance for p, m, v after several steps: 4 x baseline + 2 FLT_EPSILON x max|value|
// (test_util.h), where the baseline is the same formula run naively in fp32 over the same steps
// from the same fp32 state and gradients. The kernel differs only in how it groups the
// constants (1 - lr wd rounded once, lr / bc1 and 1 / sqrt(bc2) from fp64): about one rounding
// per step and element, like the naive loop, so the errors grow the same way with the steps.
// grad_sum_squares accumulates exact fp32 squares (products of two floats fit a double) in
// fp64; any order of summing n positive terms is within (n - 1) DBL_EPSILON x sum of the exact
// value, which is its tolerance against a long double sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/test_util.h"
#include "model_kernels/model_reference.h"
#include "model_kernels/model_test_util.h"
#include "untied/kernels/adamw.h"

namespace untied {
namespace {

using test::expect_close;
using test::make_budget;
using test::to_double;
using test::to_float;

struct OptCase {
  std::string name;
  int64_t n;
  bool decay;
  float weight_decay;
};

std::ostream& operator<<(std::ostream& os, const OptCase& c) { return os << c.name; }

class AdamWTest : public ::testing::TestWithParam<OptCase> {};

TEST_P(AdamWTest, SeveralStepsMatchTheFormula) {
  const OptCase& c = GetParam();
  constexpr int kSteps = 6;
  auto dev = test::cpu();
  test::Rng rng(61);
  const std::vector<double> p0 = test::random_values(rng, c.n, DType::kF32);
  std::vector<float> p = to_float(p0), m(c.n, 0.0f), v(c.n, 0.0f);  // kernel state
  std::vector<double> p64 = p0, m64(c.n, 0.0), v64(c.n, 0.0);       // fp64 reference
  std::vector<float> p32 = p, m32 = m, v32 = v;                     // naive fp32
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<double> g = test::random_values(rng, c.n, DType::kF32, 0.1 * step);
    g[0] = 0.0;  // an element that never gets a gradient: m = v = 0, only decay moves it
    const AdamWParams a{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                        .weight_decay = c.weight_decay, .step = step, .decay = c.decay};
    const std::vector<float> gf = to_float(g);
    adamw_step(*dev, p.data(), m.data(), v.data(), gf.data(), c.n, a);
    // The reference takes the hyperparameters as the fp32 values the kernel was given.
    const ref::AdamWHyper h{.lr = a.lr, .beta1 = a.beta1, .beta2 = a.beta2, .eps = a.eps,
                            .weight_decay = a.weight_decay, .step = step, .decay = c.decay};
    ref::adamw_step<double>(h, p64, m64, v64, g);
    ref::adamw_step<float>(h, p32, m32, v32, gf);
  }
  const std::vector<int64_t> dims = {c.n};
  EXPECT_TRUE(expect_close("adamw p", to_double(p), p64, make_budget(p64, to_double(p32), DType::kF32), dims));
  EXPECT_TRUE(expect_close("adamw m", to_double(m), m64, make_budget(m64, to_double(m32), DType::kF32), dims));
  EXPECT_TRUE(expect_close("adamw v", to_double(v), v64, make_budget(v64, to_double(v32), DType::kF32), dims));
  EXPECT_EQ(m[0], 0.0f);
  EXPECT_EQ(v[0], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Cases, AdamWTest,
                         ::testing::Values(OptCase{"decay", 1000, true, 0.1f},
                                           OptCase{"no_decay", 1000, false, 0.1f},
                                           OptCase{"two_blocks_decay", 70001, true, 0.05f}),
                         [](const auto& info) { return info.param.name; });

// decay = false ignores weight_decay entirely: bit-identical to weight_decay = 0.
TEST(AdamW, DecayFlagOffEqualsZeroWeightDecay) {
  auto dev = test::cpu();
  test::Rng rng(62);
  const std::vector<float> p0 = to_float(test::random_values(rng, 500, DType::kF32));
  const std::vector<float> g = to_float(test::random_values(rng, 500, DType::kF32));
  std::vector<float> pa = p0, ma(500, 0.1f), va(500, 0.2f), pb = p0, mb = ma, vb = va;
  adamw_step(*dev, pa.data(), ma.data(), va.data(), g.data(), 500,
             {.lr = 1e-3f, .weight_decay = 0.3f, .step = 7, .decay = false});
  adamw_step(*dev, pb.data(), mb.data(), vb.data(), g.data(), 500,
             {.lr = 1e-3f, .weight_decay = 0.0f, .step = 7, .decay = true});
  EXPECT_EQ(pa, pb);
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(va, vb);
}

TEST(GradClipping, SumOfSquaresIsFp64AndDeterministic) {
  const int64_t n = 200003;  // 4 blocks of 65536, the last partial
  test::Rng rng(63);
  const std::vector<float> g = to_float(test::random_values(rng, n, DType::kF32, 1e-3));
  long double exact = 0;
  for (float x : g) exact += static_cast<long double>(x) * x;
  auto dev1 = test::cpu(1);
  auto dev2 = test::cpu(2);
  const double s1 = grad_sum_squares(*dev1, g.data(), n);
  const double s2 = grad_sum_squares(*dev2, g.data(), n);
  EXPECT_EQ(s1, s2) << "sum of squares depends on the thread count";
  const double tol = static_cast<double>(n - 1) * DBL_EPSILON * static_cast<double>(exact);
  std::printf("[   err    ] %-28s max err %.3e  tol %.3e = (n - 1) DBL_EPSILON sum\n", "grad sum of squares",
              std::fabs(s1 - static_cast<double>(exact)), tol);
  EXPECT_LE(std::fabs(s1 - static_cast<double>(exact)), tol);
  EXPECT_EQ(grad_sum_squares(*dev1, nullptr, 0), 0.0);
}

TEST(GradClipping, ScaleInPlaceIsOneFp32Multiply) {
  const int64_t n = 70000;
  test::Rng rng(64);
  const std::vector<float> x0 = to_float(test::random_values(rng, n, DType::kF32));
  std::vector<float> x = x0;
  auto dev = test::cpu();
  const float s = 0.37f;
  scale_in_place(*dev, x.data(), n, s);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], x0[i] * s) << i;
}

TEST(GradClipping, RehearsalCountsTheBlockSums) {
  auto dev = test::rehearsal();
  dev->allocator().reset_peaks();
  EXPECT_EQ(grad_sum_squares(*dev, nullptr, 1 << 20), 0.0);
  EXPECT_EQ(dev->allocator().stats().peak[static_cast<int>(Tag::kOther)], (1 << 20) / 65536 * 8);
  adamw_step(*dev, nullptr, nullptr, nullptr, nullptr, 1 << 20, {.lr = 1e-3f});  // no compute
  scale_in_place(*dev, nullptr, 1 << 20, 0.5f);
}

TEST(AdamWValidate, RejectsBadParamsNamingTheField) {
  const AdamWParams good{.lr = 1e-3f};
  EXPECT_NO_THROW(validate(good));
  auto with = [&](auto edit) {
    AdamWParams a = good;
    edit(a);
    return [a] { validate(a); };
  };
  test::expect_invalid(with([](AdamWParams& a) { a.lr = -1e-3f; }), "lr");
  test::expect_invalid(with([](AdamWParams& a) { a.beta1 = 1.0f; }), "beta1");
  test::expect_invalid(with([](AdamWParams& a) { a.beta2 = -0.1f; }), "beta2");
  test::expect_invalid(with([](AdamWParams& a) { a.eps = 0.0f; }), "eps");
  test::expect_invalid(with([](AdamWParams& a) { a.weight_decay = -0.1f; }), "weight_decay");
  test::expect_invalid(with([](AdamWParams& a) { a.step = 0; }), "step");
  auto dev = test::cpu();
  float x = 0;
  test::expect_invalid([&] { adamw_step(*dev, &x, &x, &x, &x, -1, good); }, "n must be");
  test::expect_invalid([&] { adamw_step(*dev, &x, &x, &x, &x, 1, {.lr = 1e-3f, .step = -2}); }, "step");
  test::expect_invalid([&] { grad_sum_squares(*dev, &x, -5); }, "n must be");
  test::expect_invalid([&] { scale_in_place(*dev, &x, -5, 1.0f); }, "n must be");
}

}  // namespace
}  // namespace untied

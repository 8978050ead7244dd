// The fp64 references themselves, checked independently: every analytic gradient against
// central finite differences of the reference's own forward, and AdamW's first step against
// its closed form. The kernels are judged against these references, so these are the tests
// that make "matches the reference" mean "is correct".
//
// Finite-difference tolerance: central differences with step h = 1e-5 on O(1) inputs have a
// truncation error h^2/6 |f'''| ~ 2e-11 |f'''| and a rounding error ~ DBL_EPSILON |L| / h
// ~ 2e-11 |L|; with |f'''| and |L| below ~100 here, both stay under 2e-9. We allow 1e-7 (1 + |g|):
// 50x above that, and 10^5..10^6 below what a wrong term in a gradient formula costs (O(0.1..1)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "model_kernels/model_reference.h"

namespace untied {
namespace {

constexpr double kFdStep = 1e-5;
constexpr double kFdTol = 1e-7;

// Checks analytic[i] against (L(x + h e_i) - L(x - h e_i)) / 2h for every i.
void expect_fd(const char* what, std::vector<double>& x, const std::vector<double>& analytic,
               const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size());
  double max_err = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + kFdStep;
    const double lp = loss();
    x[i] = x0 - kFdStep;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (2 * kFdStep);
    const double err = std::fabs(fd - analytic[i]);
    max_err = std::max(max_err, err);
    EXPECT_LE(err, kFdTol * (1 + std::fabs(analytic[i])))
        << what << "[" << i << "]: analytic " << analytic[i] << ", finite difference " << fd;
  }
  std::printf("[   err    ] fd %-24s max |analytic - fd| %.3e (tol %.0e (1 + |g|))\n", what, max_err,
              kFdTol);
}

std::vector<double> normal(std::mt19937_64& rng, size_t n, double sigma = 1.0) {
  std::normal_distribution<double> d(0.0, sigma);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(ModelReference, RmsNormGradientsMatchFiniteDifferences) {
  const int64_t rows = 3, dim = 7;
  const double eps = 1e-5;
  std::mt19937_64 rng(1);
  std::vector<double> x = normal(rng, rows * dim), w = normal(rng, dim), dy = normal(rng, rows * dim);
  for (auto& v : w) v += 1.0;  // norm weights sit around 1
  auto loss = [&] {
    std::vector<double> y, rstd;
    ref::rmsnorm_forward<double>(x, w, rows, dim, eps, y, rstd);
    return dot(dy, y);
  };
  std::vector<double> y, rstd, dx, dw(dim, 0.0);
  ref::rmsnorm_forward<double>(x, w, rows, dim, eps, y, rstd);
  ref::rmsnorm_backward<double>(x, rstd, w, dy, rows, dim, dx, dw);
  expect_fd("rmsnorm dx", x, dx, loss);
  expect_fd("rmsnorm dw", w, dw, loss);
}

TEST(ModelReference, SwigluGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(2);
  std::vector<double> gate = normal(rng, 24, 3.0), up = normal(rng, 24), dout = normal(rng, 24);
  gate[0] = -1.2784645;  // near the minimum of silu, where d silu/dg crosses 0
  auto loss = [&] {
    std::vector<double> out;
    ref::swiglu_forward<double>(gate, up, out);
    return dot(dout, out);
  };
  std::vector<double> dgate, dup;
  ref::swiglu_backward<double>(gate, up, dout, dgate, dup);
  expect_fd("swiglu dgate", gate, dgate, loss);
  expect_fd("swiglu dup", up, dup, loss);
}

TEST(ModelReference, EmbeddingGradientMatchesFiniteDifferences) {
  const int64_t vocab = 5, dim = 3;
  const std::vector<int32_t> ids = {4, 1, 4, 0, 4, 1};  // repeats; id 2 and 3 unused
  std::mt19937_64 rng(3);
  std::vector<double> table = normal(rng, vocab * dim), dout = normal(rng, ids.size() * dim);
  auto loss = [&] {
    std::vector<double> out;
    ref::embedding_forward<double>(ids, table, dim, out);
    return dot(dout, out);
  };
  std::vector<double> dtable(vocab * dim, 0.0);
  ref::embedding_backward<double>(ids, dout, dim, dtable);
  expect_fd("embedding dtable", table, dtable, loss);
}

TEST(ModelReference, LossGradientsMatchFiniteDifferences) {
  const ref::LossProblem p{.tokens = 5, .dim = 4, .vocab = 7, .ignore_index = -100, .grad_scale = 0.3};
  const std::vector<int32_t> labels = {3, -100, 0, 6, 3};
  std::mt19937_64 rng(4);
  std::vector<double> h = normal(rng, p.tokens * p.dim), w = normal(rng, p.vocab * p.dim);
  auto loss = [&] {
    ref::LossResult<double> r;
    std::vector<double> dw(p.vocab * p.dim, 0.0);
    ref::lm_head_loss<double>(p, h, w, labels, r, dw);
    return p.grad_scale * r.loss_sum;
  };
  ref::LossResult<double> r;
  std::vector<double> dw(p.vocab * p.dim, 0.0);
  ref::lm_head_loss<double>(p, h, w, labels, r, dw);
  EXPECT_EQ(r.count, 4);
  // The ignored row has no gradient at all.
  for (int64_t k = 0; k < p.dim; ++k) EXPECT_EQ(r.dh[1 * p.dim + k], 0.0);
  expect_fd("loss dh", h, r.dh, loss);
  expect_fd("loss dw", w, dw, loss);
}

// The first AdamW step from m = v = 0 has a closed form: m_hat = g, v_hat = g^2, so
// p1 = p0 (1 - lr wd) - lr g / (|g| + eps).
TEST(ModelReference, AdamWFirstStepClosedForm) {
  const ref::AdamWHyper a{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                          .weight_decay = 0.1, .step = 1, .decay = true};
  std::vector<double> p = {1.0, -2.0, 0.5, 3.0}, g = {0.3, -1e-3, 0.0, 7.0};
  std::vector<double> m(4, 0.0), v(4, 0.0);
  const std::vector<double> p0 = p;
  ref::adamw_step<double>(a, p, m, v, g);
  for (size_t i = 0; i < p.size(); ++i) {
    const double want = p0[i] * (1 - a.lr * a.weight_decay) - a.lr * g[i] / (std::fabs(g[i]) + a.eps);
    // A few fp64 roundings apart (the reference goes through beta powers and bias corrections).
    EXPECT_NEAR(p[i], want, 8 * DBL_EPSILON * std::fabs(p0[i]) + 1e-18) << i;
    EXPECT_NEAR(m[i], 0.1 * g[i], 8 * DBL_EPSILON * std::fabs(g[i])) << i;
    EXPECT_NEAR(v[i], 0.05 * g[i] * g[i], 8 * DBL_EPSILON * g[i] * g[i]) << i;
  }
}

}  // namespace
}  // namespace untied

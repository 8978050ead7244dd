// RMSNorm (CPU) against the naive fp64 reference (model_reference.h).
//
// Tolerances (tests/kernels/test_util.h): err(kernel) <= 4 x baseline + 2 FLT_EPSILON x
// magnitude. Baseline: the same formula run naively in fp32 (one sequential fp32 sum of squares
// per row; the backward from the fp32 rstd that forward saved, exactly what the kernel gets), or
// for bf16 outputs the error of rounding the exact result to bf16 if larger. The kernel differs
// from that loop only by summation order (16 fp32 lanes combined in fp64: no worse than the
// sequential fp32 sum) and by fp64 accumulation of dw (better): at most about one extra rounding
// per element, hence the factor 4 of test_util.h. Magnitude: max |y| for y; for dx and dw the
// largest sum of |terms| behind an element (a partial cancellation must not shrink the floor
// below what a different summation order legitimately costs). bf16 outputs must in addition be
// the fp32 result rounded once (expect_rounded_once).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/test_util.h"
#include "model_kernels/model_reference.h"
#include "model_kernels/model_test_util.h"
#include "untied/kernels/rmsnorm.h"

namespace untied {
namespace {

using test::expect_close;
using test::make_budget;
using test::Stored;
using test::to_double;
using test::to_float;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct NormCase {
  std::string name;
  int64_t rows, dim;
  int64_t pad = 0;  // row stride = dim + pad
  DType dtype = DType::kF32, weight_dtype = DType::kF32;
  float eps = 1e-6f;
};

std::ostream& operator<<(std::ostream& os, const NormCase& c) { return os << c.name; }

std::vector<NormCase> norm_cases() {
  return {
      {.name = "f32_e64", .rows = 37, .dim = 64},
      {.name = "f32_dim300_tail", .rows = 5, .dim = 300},  // chunk (256) and lane (16) tails
      {.name = "f32_strided", .rows = 29, .dim = 48, .pad = 13, .eps = 1e-5f},
      {.name = "f32_three_row_blocks", .rows = 4100, .dim = 24},  // dw over 2048-row blocks
      {.name = "bf16_bf16w", .rows = 40, .dim = 128, .dtype = DType::kBF16,
       .weight_dtype = DType::kBF16},
      {.name = "bf16_f32w_strided", .rows = 20, .dim = 96, .pad = 32, .dtype = DType::kBF16},
      // Qwen3 per-head q/k norm: (L, H, D) = (64, 4, 128) as rows = L*H, dim = D.
      {.name = "bf16_qk_norm", .rows = 256, .dim = 128, .dtype = DType::kBF16},
  };
}

struct Problem {
  RmsNormShape shape;
  std::vector<double> x, w, dy, dw0;  // dw0: what dw holds before backward (it accumulates)
  int64_t stride() const { return shape.row_stride ? shape.row_stride : shape.dim; }
  std::vector<int64_t> dims() const { return {shape.rows, shape.dim}; }
};

Problem make_problem(const NormCase& c, uint64_t seed) {
  Problem p;
  p.shape = RmsNormShape{.rows = c.rows, .dim = c.dim, .eps = c.eps,
                         .row_stride = c.pad ? c.dim + c.pad : 0, .dtype = c.dtype,
                         .weight_dtype = c.weight_dtype};
  test::Rng rng(seed);
  p.x = test::random_values(rng, c.rows * c.dim, c.dtype);
  p.w = test::random_values(rng, c.dim, DType::kF32, 0.2);
  for (auto& v : p.w) v += 1.0;  // norm weights sit around 1
  p.w = test::stored_as(p.w, c.weight_dtype);
  p.dy = test::random_values(rng, c.rows * c.dim, c.dtype);
  p.dw0 = test::random_values(rng, c.dim, DType::kF32);
  return p;
}

// Stores w as the kernel reads it (weight_dtype, contiguous).
Stored stored_weight(const Problem& p) {
  Stored w(p.shape.weight_dtype, 1, p.shape.dim, p.shape.dim, Stored::Pad::kNaN);
  w.set(p.w);
  return w;
}

struct Forward {
  std::vector<double> y, rstd;
  int64_t padding_changed = 0;
};

Forward run_forward(Device& dev, const Problem& p) {
  const RmsNormShape& s = p.shape;
  Stored x(s.dtype, s.rows, s.dim, p.stride(), Stored::Pad::kNaN);
  x.set(p.x);
  Stored w = stored_weight(p);
  Stored y(s.dtype, s.rows, s.dim, p.stride(), Stored::Pad::kSentinel);
  y.fill_view_nan();  // `=`: every element must be written
  std::vector<float> rstd(static_cast<size_t>(s.rows), kNaN);
  rmsnorm_forward(dev, s, y.data(), rstd.data(), x.data(), w.data());
  return {y.get(), to_double(rstd), y.padding_changed()};
}

struct Backward {
  std::vector<double> dx, dw;
  int64_t padding_changed = 0;
};

Backward run_backward(Device& dev, const Problem& p, const std::vector<float>& rstd) {
  const RmsNormShape& s = p.shape;
  Stored x(s.dtype, s.rows, s.dim, p.stride(), Stored::Pad::kNaN);
  x.set(p.x);
  Stored dy(s.dtype, s.rows, s.dim, p.stride(), Stored::Pad::kNaN);
  dy.set(p.dy);
  Stored w = stored_weight(p);
  Stored dx(s.dtype, s.rows, s.dim, p.stride(), Stored::Pad::kSentinel);
  dx.fill_view_nan();
  std::vector<float> dw = to_float(p.dw0);
  rmsnorm_backward(dev, s, dx.data(), dw.data(), x.data(), rstd.data(), w.data(), dy.data());
  return {dx.get(), to_double(dw), dx.padding_changed()};
}

class RmsNormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormTest, ForwardMatchesReference) {
  const Problem p = make_problem(GetParam(), 21);
  const RmsNormShape& s = p.shape;
  auto dev = test::cpu();
  const Forward k = run_forward(*dev, p);

  std::vector<double> y64, rstd64;
  ref::rmsnorm_forward<double>(p.x, p.w, s.rows, s.dim, s.eps, y64, rstd64);
  std::vector<float> y32, rstd32;
  ref::rmsnorm_forward<float>(to_float(p.x), to_float(p.w), s.rows, s.dim, s.eps, y32, rstd32);
  EXPECT_TRUE(expect_close("rmsnorm y", k.y, y64, make_budget(y64, to_double(y32), s.dtype), p.dims()));
  if (s.dtype == DType::kBF16) {
    EXPECT_TRUE(test::expect_rounded_once("rmsnorm y", k.y, y64,
                                          make_budget(y64, to_double(y32), DType::kF32), p.dims()));
  }
  EXPECT_TRUE(expect_close("rmsnorm rstd", k.rstd, rstd64,
                           make_budget(rstd64, to_double(rstd32), DType::kF32), {s.rows}));
  EXPECT_EQ(k.padding_changed, 0) << "rmsnorm_forward wrote into the row padding";
}

TEST_P(RmsNormTest, BackwardMatchesReference) {
  const Problem p = make_problem(GetParam(), 22);
  const RmsNormShape& s = p.shape;
  auto dev = test::cpu();
  const Forward f = run_forward(*dev, p);
  const std::vector<float> rstd = to_float(f.rstd);  // what forward saved, exactly
  const Backward k = run_backward(*dev, p, rstd);

  std::vector<double> y64, rstd64, dx64, dw64 = p.dw0;
  ref::rmsnorm_forward<double>(p.x, p.w, s.rows, s.dim, s.eps, y64, rstd64);
  ref::rmsnorm_backward<double>(p.x, rstd64, p.w, p.dy, s.rows, s.dim, dx64, dw64);
  std::vector<float> dx32, dw32 = to_float(p.dw0);
  ref::rmsnorm_backward<float>(to_float(p.x), rstd, to_float(p.w), to_float(p.dy), s.rows, s.dim,
                               dx32, dw32);

  // Sums of |terms| behind each gradient element (floors; see the top of the file).
  double dx_mag = 0;
  std::vector<double> dw_mag(static_cast<size_t>(s.dim));
  for (int64_t i = 0; i < s.dim; ++i) dw_mag[i] = std::fabs(p.dw0[i]);
  for (int64_t r = 0; r < s.rows; ++r) {
    const double rr = rstd64[r];
    double dot_abs = 0;
    for (int64_t i = 0; i < s.dim; ++i) dot_abs += std::fabs(p.dy[r * s.dim + i] * p.w[i] * p.x[r * s.dim + i]);
    for (int64_t i = 0; i < s.dim; ++i) {
      const double xi = p.x[r * s.dim + i], gi = p.dy[r * s.dim + i];
      dx_mag = std::max(dx_mag, rr * std::fabs(p.w[i] * gi) + rr * rr * rr / s.dim * std::fabs(xi) * dot_abs);
      dw_mag[i] += std::fabs(gi * xi * rr);
    }
  }
  const double dw_mag_max = test::max_abs(dw_mag);

  EXPECT_TRUE(expect_close("rmsnorm dx", k.dx, dx64, make_budget(dx64, to_double(dx32), s.dtype, dx_mag),
                           p.dims()));
  if (s.dtype == DType::kBF16) {
    EXPECT_TRUE(test::expect_rounded_once("rmsnorm dx", k.dx, dx64,
                                          make_budget(dx64, to_double(dx32), DType::kF32, dx_mag), p.dims()));
  }
  EXPECT_TRUE(expect_close("rmsnorm dw (+=)", k.dw, dw64,
                           make_budget(dw64, to_double(dw32), DType::kF32, dw_mag_max), {s.dim}));
  EXPECT_EQ(k.padding_changed, 0) << "rmsnorm_backward wrote into the row padding";
}

INSTANTIATE_TEST_SUITE_P(Cases, RmsNormTest, ::testing::ValuesIn(norm_cases()),
                         [](const auto& info) { return info.param.name; });

// dw's reduction over rows is blocked independently of the thread count, and dx is row-wise:
// 1 and 2 threads give the same bits.
TEST(RmsNorm, BackwardIsDeterministicAcrossThreadCounts) {
  const Problem p = make_problem({.name = "det", .rows = 4100, .dim = 300}, 23);
  auto dev1 = test::cpu(1);
  const std::vector<float> rstd = to_float(run_forward(*dev1, p).rstd);
  const Backward a = run_backward(*dev1, p, rstd);
  auto dev2 = test::cpu(2);
  const Backward b = run_backward(*dev2, p, rstd);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dw, b.dw);
}

// dw accumulates: two calls over halves of the rows give (within rounding) one call over all.
TEST(RmsNorm, BackwardAccumulatesDwAcrossCalls) {
  const Problem p = make_problem({.name = "acc", .rows = 64, .dim = 40}, 24);
  auto dev = test::cpu();
  const std::vector<float> rstd = to_float(run_forward(*dev, p).rstd);
  const Backward whole = run_backward(*dev, p, rstd);

  const int64_t half = 32, d = p.shape.dim;
  std::vector<float> x = to_float(p.x), w = to_float(p.w), dy = to_float(p.dy), dw = to_float(p.dw0);
  std::vector<float> dx(static_cast<size_t>(p.shape.rows * d));
  RmsNormShape s = p.shape;
  s.rows = half;
  rmsnorm_backward(*dev, s, dx.data(), dw.data(), x.data(), rstd.data(), w.data(), dy.data());
  rmsnorm_backward(*dev, s, dx.data() + half * d, dw.data(), x.data() + half * d, rstd.data() + half,
                   w.data(), dy.data() + half * d);
  EXPECT_EQ(to_double(dx), whole.dx) << "dx is row-wise: tiling the rows changes nothing";
  for (int64_t i = 0; i < d; ++i)  // two fp32 roundings of dw instead of one
    EXPECT_NEAR(dw[i], whole.dw[i], 4 * FLT_EPSILON * (std::fabs(whole.dw[i]) + 1)) << i;
}

// Rehearsal allocates exactly what a real run does (the dw block sums), and documented size.
TEST(RmsNorm, RehearsalCountsTheBackwardWorkspace) {
  const Problem p = make_problem({.name = "ws", .rows = 5000, .dim = 64}, 25);
  const int tag = static_cast<int>(Tag::kOther);
  auto real = test::cpu();
  const std::vector<float> rstd = to_float(run_forward(*real, p).rstd);
  real->allocator().reset_peaks();
  run_backward(*real, p, rstd);
  auto counted = test::rehearsal();
  counted->allocator().reset_peaks();
  rmsnorm_backward(*counted, p.shape, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  const int64_t documented = (5000 + 2047) / 2048 * 64 * 8;
  EXPECT_EQ(real->allocator().stats().peak[tag], documented);
  EXPECT_EQ(counted->allocator().stats().peak[tag], documented);
  EXPECT_EQ(real->allocator().stats().live[tag], 0);
}

TEST(RmsNorm, ZeroRowsIsANoOp) {
  auto dev = test::cpu();
  const RmsNormShape s{.rows = 0, .dim = 8};
  float w[8] = {1, 1, 1, 1, 1, 1, 1, 1}, dw[8] = {};
  rmsnorm_forward(*dev, s, nullptr, nullptr, nullptr, w);
  rmsnorm_backward(*dev, s, nullptr, dw, nullptr, nullptr, w, nullptr);
  for (float v : dw) EXPECT_EQ(v, 0.0f);
}

TEST(RmsNormValidate, RejectsBadShapesNamingTheField) {
  const RmsNormShape good{.rows = 4, .dim = 8};
  EXPECT_NO_THROW(validate(good));
  auto with = [&](auto edit) {
    RmsNormShape s = good;
    edit(s);
    return [s] { validate(s); };
  };
  test::expect_invalid(with([](RmsNormShape& s) { s.rows = -1; }), "rows");
  test::expect_invalid(with([](RmsNormShape& s) { s.dim = 0; }), "dim");
  test::expect_invalid(with([](RmsNormShape& s) { s.dim = -3; }), "dim");
  test::expect_invalid(with([](RmsNormShape& s) { s.eps = -1e-6f; }), "eps");
  test::expect_invalid(with([](RmsNormShape& s) { s.eps = kNaN; }), "eps");
  test::expect_invalid(with([](RmsNormShape& s) { s.row_stride = 7; }), "row_stride");
  test::expect_invalid(with([](RmsNormShape& s) { s.dtype = DType::kI32; }), "dtype");
  test::expect_invalid(with([](RmsNormShape& s) { s.weight_dtype = DType::kF64; }), "weight_dtype");
  auto dev = test::cpu();
  float buf[64] = {};
  test::expect_invalid([&] { rmsnorm_forward(*dev, {.rows = 2, .dim = 0}, buf, buf, buf, buf); }, "dim");
  test::expect_invalid([&] { rmsnorm_backward(*dev, {.rows = -2, .dim = 4}, buf, buf, buf, buf, buf, buf); },
                       "rows");
}

}  // namespace
}  // namespace untied

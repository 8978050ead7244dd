// RoPE (CPU) against the naive fp64 reference (reference.h), HF rotate_half convention.
//
// Tolerances (test_util.h): baseline = error of the same rotation done naively in fp32 (cos/sin
// from double angles, rounded to fp32, then fp32 multiply-adds), or, for bf16 storage, the
// error of rounding the exact result to bf16 if larger; err(kernel) <= 4 x baseline +
// 2 FLT_EPSILON x the largest value. A kernel that computed angles in fp32 would fail by O(1)
// at positions in the millions (fp32 spacing at 5e6 is 0.5 rad), far above these tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/fast_sincos.h"
#include "kernels/reference.h"
#include "kernels/test_util.h"
#include "untied/core/check.h"
#include "untied/device/device.h"
#include "untied/kernels/rope.h"
#include "kernels/rope_freq.h"

namespace untied {
namespace {

using test::expect_close;
using test::make_budget;
using test::Stored;

struct RopeCase {
  std::string name;
  int64_t tokens, heads, head_dim;
  int64_t pad = 0;  // row stride = heads * D + pad
  double theta = 10000.0;
  DType dtype = DType::kF32;
  std::vector<int64_t> positions = {};  // empty: 0, 1, ..., tokens-1 shifted by `start`
  int64_t start = 0;
  RopeScaling scaling = {};
};

// The scaled frequencies as Hugging Face computes them (transformers' rope init functions:
// linear divides by the factor; llama3 masks by wavelength, then smooths the middle band),
// written out element by element in double: the reference the kernels' one formula is held to.
std::vector<double> scaled_inv_freq(const RopeCase& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) f[i] = 1.0 / std::pow(c.theta, static_cast<double>(2 * i) / c.head_dim);
  const RopeScaling& s = c.scaling;
  if (s.type == RopeScalingType::kLinear)
    for (double& x : f) x /= s.factor;
  if (s.type == RopeScalingType::kLlama3) {
    const double low_wavelen = s.original_max_position / s.low_freq_factor;
    const double high_wavelen = s.original_max_position / s.high_freq_factor;
    for (double& x : f) {
      const double wavelen = 2 * M_PI / x;
      double llama = wavelen > low_wavelen ? x / s.factor : x;
      const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) llama = (1 - smooth) * llama / s.factor + smooth * llama;
      x = llama;
    }
  }
  return s.type == RopeScalingType::kNone ? std::vector<double>{} : f;
}

std::ostream& operator<<(std::ostream& os, const RopeCase& c) { return os << c.name; }

std::vector<int64_t> positions_of(const RopeCase& c) {
  if (!c.positions.empty()) return c.positions;
  std::vector<int64_t> p(static_cast<size_t>(c.tokens));
  for (int64_t t = 0; t < c.tokens; ++t) p[t] = c.start + t;
  return p;
}

RopeShape shape_of(const RopeCase& c) {
  return RopeShape{.tokens = c.tokens, .heads = c.heads, .head_dim = c.head_dim,
                   .row_stride = c.pad ? c.heads * c.head_dim + c.pad : 0, .theta = c.theta,
                   .dtype = c.dtype, .scaling = c.scaling};
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }
std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

std::unique_ptr<Device> cpu() { return make_cpu_device(CpuDeviceOptions{.threads = 2}); }

std::vector<RopeCase> rope_cases() {
  // Positions of a large global sequence, out of order (as a zig-zag shard holds them). Up to
  // ~1e8: beyond that even a double angle pos * inv_freq carries ~pos * 1e-16 rad of error
  // from how inv_freq is evaluated (pow vs exp/log), which nears fp32 resolution at ~1e9.
  const std::vector<int64_t> large = {5000000, 4999999, 5000001, 123456789, 0,
                                      1,       16777217, 7,     4194304,   33554431};
  const std::vector<int64_t> zigzag = {0, 1, 2, 3, 60, 61, 62, 63, 28, 29, 30, 31, 32, 33, 34, 35};
  return {
      {.name = "f32_d64", .tokens = 37, .heads = 4, .head_dim = 64},
      {.name = "f32_d128_theta500k", .tokens = 50, .heads = 8, .head_dim = 128,
       .theta = 500000.0, .start = 1000},
      {.name = "f32_d2", .tokens = 5, .heads = 1, .head_dim = 2},
      {.name = "f32_strided", .tokens = 29, .heads = 3, .head_dim = 64, .pad = 13},
      {.name = "f32_zigzag", .tokens = 16, .heads = 2, .head_dim = 64, .positions = zigzag},
      {.name = "f32_large_positions", .tokens = 10, .heads = 2, .head_dim = 128,
       .positions = large},
      {.name = "bf16_d128", .tokens = 40, .heads = 4, .head_dim = 128, .dtype = DType::kBF16},
      {.name = "bf16_strided_large_positions", .tokens = 10, .heads = 2, .head_dim = 64,
       .pad = 64, .dtype = DType::kBF16, .positions = large},
      // Frequency scaling: Llama 3.1's (factor 8, low 1, high 4, original 8192; D 128 puts
      // pairs in all three wavelength bands) at long positions, and linear.
      {.name = "f32_llama3_scaling", .tokens = 10, .heads = 2, .head_dim = 128, .theta = 500000.0,
       .positions = large,
       .scaling = {.type = RopeScalingType::kLlama3, .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                   .original_max_position = 8192.0}},
      {.name = "bf16_llama3_scaling_d64", .tokens = 40, .heads = 4, .head_dim = 64, .theta = 500000.0,
       .dtype = DType::kBF16, .start = 100000,
       .scaling = {.type = RopeScalingType::kLlama3, .factor = 32.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                   .original_max_position = 8192.0}},
      {.name = "f32_linear_scaling", .tokens = 30, .heads = 2, .head_dim = 64, .start = 5000,
       .scaling = {.type = RopeScalingType::kLinear, .factor = 4.0}},
  };
}

class RopeTest : public ::testing::TestWithParam<RopeCase> {
 protected:
  void SetUp() override {
    const RopeCase& c = GetParam();
    shape_ = shape_of(c);
    pos_ = positions_of(c);
    test::Rng rng(11);
    x_ = test::random_values(rng, c.tokens * c.heads * c.head_dim, c.dtype);
    dims_ = {c.tokens, c.heads, c.head_dim};
    freq_ = scaled_inv_freq(c);
  }
  int64_t cols() const { return shape_.heads * shape_.head_dim; }
  int64_t stride() const { return shape_.row_stride ? shape_.row_stride : cols(); }

  RopeShape shape_;
  std::vector<int64_t> pos_;
  std::vector<double> x_;
  std::vector<int64_t> dims_;
  std::vector<double> freq_;  // scaled frequencies (empty: theta's)
};

TEST_P(RopeTest, ForwardMatchesReference) {
  auto dev = cpu();
  Stored x(shape_.dtype, shape_.tokens, cols(), stride(), Stored::Pad::kNaN);
  x.set(x_);
  rope_forward(*dev, shape_, x.data(), pos_.data());

  std::vector<double> y64 = x_;
  ref::rope_forward<double>(y64, shape_.tokens, shape_.heads, shape_.head_dim, pos_, shape_.theta, freq_);
  std::vector<float> y32 = to_float(x_);
  ref::rope_forward<float>(y32, shape_.tokens, shape_.heads, shape_.head_dim, pos_, shape_.theta, freq_);
  EXPECT_TRUE(expect_close("rope forward", x.get(), y64,
                           make_budget(y64, to_double(y32), shape_.dtype), dims_));
  if (shape_.dtype == DType::kBF16) {
    EXPECT_TRUE(test::expect_rounded_once(
        "rope forward", x.get(), y64, make_budget(y64, to_double(y32), DType::kF32), dims_));
  }
  EXPECT_EQ(x.padding_changed(), 0) << "rope_forward wrote into the row padding";
}

TEST_P(RopeTest, BackwardMatchesReference) {
  auto dev = cpu();
  Stored dx(shape_.dtype, shape_.tokens, cols(), stride(), Stored::Pad::kNaN);
  dx.set(x_);
  rope_backward(*dev, shape_, dx.data(), pos_.data());

  std::vector<double> g64 = x_;
  ref::rope_backward<double>(g64, shape_.tokens, shape_.heads, shape_.head_dim, pos_, shape_.theta, freq_);
  std::vector<float> g32 = to_float(x_);
  ref::rope_backward<float>(g32, shape_.tokens, shape_.heads, shape_.head_dim, pos_, shape_.theta, freq_);
  EXPECT_TRUE(expect_close("rope backward", dx.get(), g64,
                           make_budget(g64, to_double(g32), shape_.dtype), dims_));
  if (shape_.dtype == DType::kBF16) {
    EXPECT_TRUE(test::expect_rounded_once(
        "rope backward", dx.get(), g64, make_budget(g64, to_double(g32), DType::kF32), dims_));
  }
  EXPECT_EQ(dx.padding_changed(), 0) << "rope_backward wrote into the row padding";
}

// Backward is the inverse of forward: forward then backward returns x within fp32 rounding.
// "fp32 rounding" measured, not guessed: the naive fp32 round trip's error is the baseline.
// Only for fp32 storage (bf16 storage rounds between the two calls, by design).
TEST_P(RopeTest, BackwardInvertsForward) {
  if (shape_.dtype != DType::kF32) GTEST_SKIP() << "bf16 storage rounds between the calls";
  auto dev = cpu();
  Stored x(shape_.dtype, shape_.tokens, cols(), stride(), Stored::Pad::kNaN);
  x.set(x_);
  rope_forward(*dev, shape_, x.data(), pos_.data());
  rope_backward(*dev, shape_, x.data(), pos_.data());

  std::vector<float> rt = to_float(x_);
  ref::rope_forward<float>(rt, shape_.tokens, shape_.heads, shape_.head_dim, pos_, shape_.theta, freq_);
  ref::rope_backward<float>(rt, shape_.tokens, shape_.heads, shape_.head_dim, pos_, shape_.theta, freq_);
  EXPECT_TRUE(expect_close("rope round trip", x.get(), x_,
                           make_budget(x_, to_double(rt), DType::kF32), dims_));
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeTest, ::testing::ValuesIn(rope_cases()),
                         [](const auto& info) { return info.param.name; });

// Two tokens one position apart at 5e6: the second must be the first rotated by one more
// position, which a kernel with fp32 angles gets wrong by O(1). Checked through the reference
// above; here the property itself, independent of the reference: R(5e6) x vs R(1) R(4999999) x.
TEST(Rope, LargePositionsComposeExactly) {
  auto dev = cpu();
  const int64_t heads = 1, d = 64;
  RopeShape s{.tokens = 1, .heads = heads, .head_dim = d};
  test::Rng rng(5);
  const std::vector<double> x = test::random_values(rng, heads * d, DType::kF32);
  Stored a(DType::kF32, 1, d, d, Stored::Pad::kNaN), b(DType::kF32, 1, d, d, Stored::Pad::kNaN);
  a.set(x);
  b.set(x);
  const int64_t p5m = 5000000, p5m1 = 4999999, p1 = 1;
  rope_forward(*dev, s, a.data(), &p5m);
  rope_forward(*dev, s, b.data(), &p5m1);
  rope_forward(*dev, s, b.data(), &p1);
  // Baseline: the same three rotations naively in fp32 against fp64.
  std::vector<double> a64 = x;
  ref::rope_forward<double>(a64, 1, heads, d, {p5m}, 10000.0);
  std::vector<float> b32 = to_float(x);
  ref::rope_forward<float>(b32, 1, heads, d, {p5m1}, 10000.0);
  ref::rope_forward<float>(b32, 1, heads, d, {p1}, 10000.0);
  test::ErrorBudget budget = make_budget(a64, to_double(b32), DType::kF32);
  EXPECT_TRUE(expect_close("R(5e6)x, kernel", a.get(), a64, budget, {1, heads, d}));
  EXPECT_TRUE(expect_close("R(1)R(5e6-1)x, kernel", b.get(), a64, budget, {1, heads, d}));
}

// ---- bad input ----------------------------------------------------------------------------

void expect_invalid(const RopeShape& s, const std::string& field) {
  SCOPED_TRACE("field " + field);
  try {
    validate(s);
    ADD_FAILURE() << "validate accepted a RopeShape with a bad " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
        << "message does not name `" << field << "`: " << e.what();
  }
}

// The CPU table's sin/cos (fast_sincos.h) against glibc's at RoPE's own angles: positions from 0
// to 1e8 times every frequency of D = 128 at theta 5e5, and random angles up to 2^40 of both
// signs. Each within 3e-16 of glibc's (both within about an ulp of the truth), and the same
// floats after rounding (a difference needs an argument within about 2^-51 of a float rounding
// boundary; none among these 2 million).
TEST(FastSincos, MatchesGlibcToTheFloat) {
  std::vector<double> angles;
  std::mt19937_64 gen(5);
  std::uniform_int_distribution<int64_t> pos(0, 100'000'000);
  for (int n = 0; n < 8000; ++n) {
    const int64_t p = n < 4000 ? n : pos(gen);
    for (int64_t i = 0; i < 64; ++i) angles.push_back(static_cast<double>(p) * rope_inv_freq(5e5, i, 128, RopeScaling{}));
  }
  std::uniform_real_distribution<double> any(-std::ldexp(1.0, 40), std::ldexp(1.0, 40));
  while (angles.size() < 2'000'000) angles.push_back(any(gen));
  double worst = 0;
  int64_t float_diffs = 0;
  for (double x : angles) {
    double s, c;
    cpu::fast_sincos(x, &s, &c);
    worst = std::max({worst, std::fabs(s - std::sin(x)), std::fabs(c - std::cos(x))});
    float_diffs += static_cast<float>(s) != static_cast<float>(std::sin(x));
    float_diffs += static_cast<float>(c) != static_cast<float>(std::cos(x));
  }
  EXPECT_LE(worst, 3e-16);
  EXPECT_EQ(float_diffs, 0);
}

TEST(RopeValidate, RejectsBadShapesNamingTheField) {
  const RopeShape good{.tokens = 4, .heads = 2, .head_dim = 64};
  EXPECT_NO_THROW(validate(good));
  auto with = [&](auto edit) {
    RopeShape s = good;
    edit(s);
    return s;
  };
  expect_invalid(with([](RopeShape& s) { s.head_dim = 63; }), "head_dim");
  expect_invalid(with([](RopeShape& s) { s.head_dim = 0; }), "head_dim");
  expect_invalid(with([](RopeShape& s) { s.head_dim = -2; }), "head_dim");
  expect_invalid(with([](RopeShape& s) { s.heads = 0; }), "heads");
  expect_invalid(with([](RopeShape& s) { s.heads = -1; }), "heads");
  expect_invalid(with([](RopeShape& s) { s.tokens = -1; }), "tokens");
  expect_invalid(with([](RopeShape& s) { s.row_stride = 2 * 64 - 1; }), "row_stride");
  expect_invalid(with([](RopeShape& s) { s.theta = 0.0; }), "theta");
  expect_invalid(with([](RopeShape& s) { s.dtype = DType::kI64; }), "");  // kind only
}

TEST(RopeValidate, KernelsValidateAtTheBoundary) {
  auto dev = cpu();
  RopeShape s{.tokens = 2, .heads = 1, .head_dim = 7};
  std::vector<float> x(16);
  const int64_t pos[2] = {0, 1};
  EXPECT_THROW(rope_forward(*dev, s, x.data(), pos), Error);
  EXPECT_THROW(rope_backward(*dev, s, x.data(), pos), Error);
}

}  // namespace
}  // namespace untied

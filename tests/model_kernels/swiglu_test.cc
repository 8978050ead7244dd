// SwiGLU (CPU) against the naive fp64 reference (model_reference.h).
//
// Tolerances: element-wise formulas, so the baseline is the same formula in fp32 (std::exp,
// then a handful of products), or for bf16 outputs the error of rounding the exact result to
// bf16 if larger; err(kernel) <= 4 x baseline + 2 FLT_EPSILON x magnitude (test_util.h). The
// kernel groups the products differently (e.g. (dout * up) * silu'(g)), which costs at most a
// couple of roundings per element. Magnitude: max|result|, except dgate, where 1 + g (1 - s)
// cancels near the minimum of silu (g ~ -1.28): there the floor uses
// |dout up s| (1 + |g (1 - s)|), the size of the terms that cancel.
// bf16 outputs must in addition be the fp32 result rounded once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/test_util.h"
#include "model_kernels/model_reference.h"
#include "model_kernels/model_test_util.h"
#include "untied/kernels/swiglu.h"

namespace untied {
namespace {

using test::expect_close;
using test::make_budget;
using test::Stored;
using test::to_double;
using test::to_float;

struct SwigluCase {
  std::string name;
  int64_t rows, dim;
  bool fused = false;    // gate and up interleaved in one (rows, 2F + in_pad) buffer
  int64_t in_pad = 0;    // extra elements per input row
  int64_t out_pad = 0;   // extra elements per output row
  DType dtype = DType::kF32;
  double sigma = 3.0;    // spread of gate values: both tails of the sigmoid
};

std::ostream& operator<<(std::ostream& os, const SwigluCase& c) { return os << c.name; }

std::vector<SwigluCase> swiglu_cases() {
  return {
      {.name = "f32", .rows = 33, .dim = 300},
      {.name = "f32_saturated", .rows = 8, .dim = 64, .sigma = 40.0},  // exp overflow/underflow
      {.name = "f32_fused_gate_up", .rows = 17, .dim = 96, .fused = true, .out_pad = 5},
      {.name = "f32_strided", .rows = 9, .dim = 50, .in_pad = 7, .out_pad = 3},
      {.name = "bf16", .rows = 40, .dim = 128, .dtype = DType::kBF16},
      {.name = "bf16_fused_gate_up", .rows = 12, .dim = 260, .fused = true, .dtype = DType::kBF16},
  };
}

// The kernel's view of a case: two input matrices (possibly one fused buffer) and strides.
struct Layout {
  SwigluShape shape;
  int64_t in_stride, out_stride;
};

Layout layout_of(const SwigluCase& c) {
  const int64_t in_stride = (c.fused ? 2 * c.dim : c.dim) + c.in_pad;
  const int64_t out_stride = c.dim + c.out_pad;
  return {SwigluShape{.rows = c.rows, .dim = c.dim, .in_row_stride = in_stride,
                      .out_row_stride = out_stride, .dtype = c.dtype},
          in_stride, out_stride};
}

// gate and up stored in the case's layout: separately, or fused [gate | up | pad] per row.
class Inputs {
 public:
  Inputs(const SwigluCase& c, const Layout& l, Stored::Pad pad)
      : fused_(c.fused), rows_(c.rows), dim_(c.dim), es_(dtype_size(c.dtype)),
        a_(c.dtype, c.rows, c.fused ? 2 * c.dim : c.dim, l.in_stride, pad),
        b_(c.dtype, c.fused ? 0 : c.rows, c.dim, l.in_stride, pad) {}
  void* gate() { return a_.data(); }
  void* up() { return fused_ ? static_cast<char*>(a_.data()) + dim_ * es_ : b_.data(); }
  void set(const std::vector<double>& g, const std::vector<double>& u) {
    if (!fused_) {
      a_.set(g);
      b_.set(u);
      return;
    }
    std::vector<double> both(static_cast<size_t>(rows_ * 2 * dim_));
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t i = 0; i < dim_; ++i) {
        both[r * 2 * dim_ + i] = g[r * dim_ + i];
        both[r * 2 * dim_ + dim_ + i] = u[r * dim_ + i];
      }
    a_.set(both);
  }
  std::vector<double> gate_values() const { return part(0); }
  std::vector<double> up_values() const { return fused_ ? part(dim_) : b_.get(); }
  void fill_nan() {
    a_.fill_view_nan();
    if (!fused_) b_.fill_view_nan();
  }
  int64_t padding_changed() const { return a_.padding_changed() + b_.padding_changed(); }

 private:
  std::vector<double> part(int64_t offset) const {
    if (!fused_) return a_.get();
    const std::vector<double> both = a_.get();
    std::vector<double> out(static_cast<size_t>(rows_ * dim_));
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t i = 0; i < dim_; ++i) out[r * dim_ + i] = both[r * 2 * dim_ + offset + i];
    return out;
  }
  bool fused_;
  int64_t rows_, dim_, es_;
  Stored a_, b_;
};

struct Problem {
  SwigluCase c;
  Layout l;
  std::vector<double> gate, up, dout;
  std::vector<int64_t> dims() const { return {c.rows, c.dim}; }
};

Problem make_problem(const SwigluCase& c, uint64_t seed) {
  Problem p{c, layout_of(c), {}, {}, {}};
  test::Rng rng(seed);
  const int64_t n = c.rows * c.dim;
  p.gate = test::random_values(rng, n, c.dtype, c.sigma);
  p.up = test::random_values(rng, n, c.dtype);
  p.dout = test::random_values(rng, n, c.dtype);
  return p;
}

class SwigluTest : public ::testing::TestWithParam<SwigluCase> {};

TEST_P(SwigluTest, ForwardMatchesReference) {
  const Problem p = make_problem(GetParam(), 31);
  const DType t = p.c.dtype;
  auto dev = test::cpu();
  Inputs in(p.c, p.l, Stored::Pad::kNaN);
  in.set(p.gate, p.up);
  Stored out(t, p.c.rows, p.c.dim, p.l.out_stride, Stored::Pad::kSentinel);
  out.fill_view_nan();
  swiglu_forward(*dev, p.l.shape, out.data(), in.gate(), in.up());

  std::vector<double> o64;
  ref::swiglu_forward<double>(p.gate, p.up, o64);
  std::vector<float> o32;
  ref::swiglu_forward<float>(to_float(p.gate), to_float(p.up), o32);
  EXPECT_TRUE(expect_close("swiglu out", out.get(), o64, make_budget(o64, to_double(o32), t), p.dims()));
  if (t == DType::kBF16) {
    EXPECT_TRUE(test::expect_rounded_once("swiglu out", out.get(), o64,
                                          make_budget(o64, to_double(o32), DType::kF32), p.dims()));
  }
  EXPECT_EQ(out.padding_changed(), 0);
}

// out may alias gate (equal strides, swiglu.h): the same values as into a separate buffer.
TEST_P(SwigluTest, ForwardInPlaceOverGateMatchesReference) {
  const Problem p = make_problem(GetParam(), 34);
  if (p.c.fused || p.l.in_stride != p.l.out_stride) GTEST_SKIP() << "in place needs equal strides";
  auto dev = test::cpu();
  Inputs in(p.c, p.l, Stored::Pad::kNaN);
  in.set(p.gate, p.up);
  swiglu_forward(*dev, p.l.shape, in.gate(), in.gate(), in.up());
  std::vector<double> o64;
  ref::swiglu_forward<double>(p.gate, p.up, o64);
  std::vector<float> o32;
  ref::swiglu_forward<float>(to_float(p.gate), to_float(p.up), o32);
  EXPECT_TRUE(expect_close("swiglu out over gate", in.gate_values(), o64,
                           make_budget(o64, to_double(o32), p.c.dtype), p.dims()));
}

// Reference gradients and their budgets for a problem.
struct GradRef {
  std::vector<double> dgate, dup;
  test::ErrorBudget dgate_budget, dup_budget, dgate_f32, dup_f32;
};

GradRef grad_ref(const Problem& p) {
  GradRef r;
  ref::swiglu_backward<double>(p.gate, p.up, p.dout, r.dgate, r.dup);
  std::vector<float> dg32, du32;
  ref::swiglu_backward<float>(to_float(p.gate), to_float(p.up), to_float(p.dout), dg32, du32);
  double dgate_mag = 0;
  for (size_t i = 0; i < p.gate.size(); ++i) {
    const double g = p.gate[i], s = 1 / (1 + std::exp(-g));
    dgate_mag = std::max(dgate_mag, std::fabs(p.dout[i] * p.up[i] * s) * (1 + std::fabs(g * (1 - s))));
  }
  const DType t = p.c.dtype;
  r.dgate_budget = make_budget(r.dgate, to_double(dg32), t, dgate_mag);
  r.dup_budget = make_budget(r.dup, to_double(du32), t);
  r.dgate_f32 = make_budget(r.dgate, to_double(dg32), DType::kF32, dgate_mag);
  r.dup_f32 = make_budget(r.dup, to_double(du32), DType::kF32);
  return r;
}

void check_grads(const std::string& what, const Problem& p, const GradRef& r,
                 const std::vector<double>& dgate, const std::vector<double>& dup) {
  EXPECT_TRUE(expect_close(what + " dgate", dgate, r.dgate, r.dgate_budget, p.dims()));
  EXPECT_TRUE(expect_close(what + " dup", dup, r.dup, r.dup_budget, p.dims()));
  if (p.c.dtype == DType::kBF16) {
    EXPECT_TRUE(test::expect_rounded_once(what + " dgate", dgate, r.dgate, r.dgate_f32, p.dims()));
    EXPECT_TRUE(test::expect_rounded_once(what + " dup", dup, r.dup, r.dup_f32, p.dims()));
  }
}

TEST_P(SwigluTest, BackwardMatchesReference) {
  const Problem p = make_problem(GetParam(), 32);
  const DType t = p.c.dtype;
  auto dev = test::cpu();
  Inputs in(p.c, p.l, Stored::Pad::kNaN);
  in.set(p.gate, p.up);
  Stored dout(t, p.c.rows, p.c.dim, p.l.out_stride, Stored::Pad::kNaN);
  dout.set(p.dout);
  Inputs grads(p.c, p.l, Stored::Pad::kSentinel);  // dgate, dup in the input layout
  grads.fill_nan();
  swiglu_backward(*dev, p.l.shape, grads.gate(), grads.up(), in.gate(), in.up(), dout.data());
  check_grads("swiglu", p, grad_ref(p), grads.gate_values(), grads.up_values());
  EXPECT_EQ(grads.padding_changed(), 0);
}

// dgate may alias gate and dup may alias up (swiglu.h): the fused buffer receives its own
// gradient, with the same values as into separate buffers.
TEST_P(SwigluTest, BackwardInPlaceMatchesReference) {
  const Problem p = make_problem(GetParam(), 33);
  const DType t = p.c.dtype;
  auto dev = test::cpu();
  Inputs in(p.c, p.l, Stored::Pad::kNaN);
  in.set(p.gate, p.up);
  Stored dout(t, p.c.rows, p.c.dim, p.l.out_stride, Stored::Pad::kNaN);
  dout.set(p.dout);
  swiglu_backward(*dev, p.l.shape, in.gate(), in.up(), in.gate(), in.up(), dout.data());
  check_grads("swiglu in place", p, grad_ref(p), in.gate_values(), in.up_values());
}

INSTANTIATE_TEST_SUITE_P(Cases, SwigluTest, ::testing::ValuesIn(swiglu_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(SwigluValidate, RejectsBadShapesNamingTheField) {
  const SwigluShape good{.rows = 4, .dim = 8};
  EXPECT_NO_THROW(validate(good));
  auto with = [&](auto edit) {
    SwigluShape s = good;
    edit(s);
    return [s] { validate(s); };
  };
  test::expect_invalid(with([](SwigluShape& s) { s.rows = -1; }), "rows");
  test::expect_invalid(with([](SwigluShape& s) { s.dim = 0; }), "dim");
  test::expect_invalid(with([](SwigluShape& s) { s.in_row_stride = 7; }), "in_row_stride");
  test::expect_invalid(with([](SwigluShape& s) { s.out_row_stride = 3; }), "out_row_stride");
  test::expect_invalid(with([](SwigluShape& s) { s.dtype = DType::kI64; }), "dtype");
  auto dev = test::cpu();
  float buf[16] = {};
  test::expect_invalid([&] { swiglu_forward(*dev, {.rows = 1, .dim = -1}, buf, buf, buf); }, "dim");
  test::expect_invalid([&] { swiglu_backward(*dev, {.rows = -1, .dim = 2}, buf, buf, buf, buf, buf); },
                       "rows");
}

}  // namespace
}  // namespace untied

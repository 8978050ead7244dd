// The fused, chunked LM head + cross-entropy (CPU) against an unfused fp64 reference that holds
// the full (tokens, V) logits and their log-softmax (model_reference.h).
//
// Tolerances (test_util.h): err(kernel) <= 4 x baseline + 2 FLT_EPSILON x magnitude. Baseline:
// the same unfused computation run naively in fp32 (sequential dot products for the logits,
// an fp32 sum of exponentials, fp32 sums for dh and dw) against fp64; for bf16 dh, the error of
// rounding the exact dh to bf16 if larger. The kernel computes the logits and both gradient
// products with BLAS (blocked, FMA: the same eps-per-operation error model, another order) and
// sums the exponentials in fp64 (better), so it costs at most about one extra rounding per
// element against the naive loop: the factor 4 of test_util.h. Magnitudes: for loss_sum the
// sum over labelled rows of |lse| + |logit[label]| (the loss is a difference of those); for dh
// and dw the largest sum of |terms| behind an element (|G| |w| and |dw0| + |G|^T |h|), since
// softmax - onehot cancels by construction (its row sums to 0).
// The argmax is checked against the reference logits: the kernel's pick must be a maximum up to
// the logits' fp32 error (a tie broken differently is not a bug; a wrong row or index is).
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
#include "untied/kernels/lm_head_loss.h"

namespace untied {
namespace {

using test::expect_close;
using test::make_budget;
using test::Stored;
using test::to_double;
using test::to_float;

constexpr int32_t kIgnore = -100;

struct LossCase {
  std::string name;
  int64_t tokens, dim, vocab;
  int64_t chunk = 0;              // chunk_tokens (0 = default)
  double ignored = 0.25;          // fraction of random labels that are ignore_index
  DType dtype = DType::kF32, weight_dtype = DType::kF32;
};

std::ostream& operator<<(std::ostream& os, const LossCase& c) { return os << c.name; }

std::vector<LossCase> loss_cases() {
  return {
      {.name = "f32_default_chunk", .tokens = 37, .dim = 48, .vocab = 100},
      {.name = "f32_chunk1", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 1},
      {.name = "f32_chunk5_not_dividing", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 5},
      {.name = "f32_chunk16", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 16},
      {.name = "f32_chunk_over_tokens", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 64},
      {.name = "f32_no_ignored", .tokens = 20, .dim = 32, .vocab = 257, .chunk = 6, .ignored = 0.0},
      {.name = "f32_all_ignored", .tokens = 20, .dim = 32, .vocab = 50, .chunk = 6, .ignored = 1.0},
      {.name = "bf16_h_chunk7", .tokens = 30, .dim = 64, .vocab = 120, .chunk = 7,
       .dtype = DType::kBF16},
      {.name = "bf16_h_bf16_w", .tokens = 30, .dim = 40, .vocab = 90, .chunk = 10,
       .dtype = DType::kBF16, .weight_dtype = DType::kBF16},
      // V * E * 4 > 16 MiB: the bf16 w is widened in two vocab blocks per GEMM sweep.
      {.name = "f32_h_bf16_w_two_blocks", .tokens = 6, .dim = 64, .vocab = 70000, .chunk = 4,
       .weight_dtype = DType::kBF16},
  };
}

struct Problem {
  LmHeadLossShape shape;
  std::vector<double> h, w, dw0;
  std::vector<int32_t> labels;
  int64_t labelled = 0;
  ref::LossProblem ref_problem() const {
    return {.tokens = shape.tokens, .dim = shape.dim, .vocab = shape.vocab,
            .ignore_index = shape.ignore_index, .grad_scale = static_cast<double>(shape.grad_scale)};
  }
};

Problem make_problem(const LossCase& c, uint64_t seed) {
  Problem p;
  p.shape = LmHeadLossShape{.tokens = c.tokens, .dim = c.dim, .vocab = c.vocab,
                            .chunk_tokens = c.chunk, .ignore_index = kIgnore, .dtype = c.dtype,
                            .weight_dtype = c.weight_dtype};
  test::Rng rng(seed);
  p.h = test::random_values(rng, c.tokens * c.dim, c.dtype);
  // w ~ N(0, 9/E): logits ~ N(0, 9), a realistic spread (softmax neither flat nor one-hot).
  p.w = test::random_values(rng, c.vocab * c.dim, c.weight_dtype, 3.0 / std::sqrt(double(c.dim)));
  p.dw0 = test::random_values(rng, c.vocab * c.dim, DType::kF32, 0.01);
  std::uniform_int_distribution<int32_t> cls(0, static_cast<int32_t>(c.vocab - 1));
  std::uniform_real_distribution<double> u(0, 1);
  p.labels.resize(static_cast<size_t>(c.tokens));
  for (int64_t t = 0; t < c.tokens; ++t) {
    const bool ignore = u(rng) < c.ignored || (t >= 10 && t < 15);  // rows 10..14: a whole chunk of 5
    p.labels[t] = ignore ? kIgnore : cls(rng);
    p.labelled += !ignore;
  }
  // As the trainer does: 1 / (labels over all ranks); here as if a second rank had as many.
  p.shape.grad_scale = p.labelled > 0 ? static_cast<float>(1.0 / (2.0 * p.labelled)) : 1.0f;
  return p;
}

struct KernelResult {
  LossSums sums;
  std::vector<int32_t> argmax;
  std::vector<double> dh, dw;
  int64_t dh_padding_changed = 0;
};

KernelResult run_kernel(Device& dev, const Problem& p, bool backward) {
  const LmHeadLossShape& s = p.shape;
  Stored h(s.dtype, s.tokens, s.dim, s.dim, Stored::Pad::kNaN);
  h.set(p.h);
  Stored w(s.weight_dtype, s.vocab, s.dim, s.dim, Stored::Pad::kNaN);
  w.set(p.w);
  Stored dh(s.dtype, s.tokens, s.dim, s.dim, Stored::Pad::kSentinel);
  dh.fill_view_nan();  // `=`: every element, ignored rows included, must be written
  std::vector<float> dw = to_float(p.dw0);
  KernelResult r;
  r.argmax.assign(static_cast<size_t>(s.tokens), -1);
  if (backward)
    lm_head_loss_forward_backward(dev, s, &r.sums, r.argmax.data(), dh.data(), dw.data(), h.data(),
                                  p.labels.data(), w.data());
  else
    lm_head_loss_forward(dev, s, &r.sums, r.argmax.data(), h.data(), p.labels.data(), w.data());
  r.dh = dh.get();
  r.dw = to_double(dw);
  r.dh_padding_changed = dh.padding_changed();
  return r;
}

// The fp64 reference, its fp32 twin, and the budgets.
struct Reference {
  ref::LossResult<double> r64;
  ref::LossResult<float> r32;
  std::vector<double> dw64;
  test::ErrorBudget loss, dh, dh_f32, dw;
  double logit_tol = 0;
};

Reference reference(const Problem& p) {
  Reference R;
  const ref::LossProblem rp = p.ref_problem();
  const LmHeadLossShape& s = p.shape;
  R.dw64 = p.dw0;
  ref::lm_head_loss<double>(rp, p.h, p.w, p.labels, R.r64, R.dw64);
  std::vector<float> dw32 = to_float(p.dw0);
  ref::lm_head_loss<float>(rp, to_float(p.h), to_float(p.w), p.labels, R.r32, dw32);

  // Magnitudes (see the top of the file).
  const int64_t n = s.tokens, e = s.dim, v = s.vocab;
  double loss_mag = 0;
  std::vector<double> dh_mag(static_cast<size_t>(n * e), 0.0), dw_mag(p.dw0.size());
  for (size_t i = 0; i < dw_mag.size(); ++i) dw_mag[i] = std::fabs(p.dw0[i]);
  std::vector<double> g_abs(static_cast<size_t>(v));
  for (int64_t t = 0; t < n; ++t) {
    if (p.labels[t] == s.ignore_index) continue;
    const double* row = &R.r64.logits[t * v];
    double mx = row[0], sum = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
    const double lse = mx + std::log(sum);
    loss_mag += std::fabs(lse) + std::fabs(row[p.labels[t]]);
    for (int64_t j = 0; j < v; ++j)
      g_abs[j] = s.grad_scale * (std::exp(row[j] - lse) + (j == p.labels[t] ? 1.0 : 0.0));
    for (int64_t j = 0; j < v; ++j)
      for (int64_t k = 0; k < e; ++k) {
        dh_mag[t * e + k] += g_abs[j] * std::fabs(p.w[j * e + k]);
        dw_mag[j * e + k] += g_abs[j] * std::fabs(p.h[t * e + k]);
      }
  }
  R.loss = make_budget({R.r64.loss_sum}, {static_cast<double>(R.r32.loss_sum)}, DType::kF32, loss_mag);
  R.dh = make_budget(R.r64.dh, to_double(R.r32.dh), s.dtype, test::max_abs(dh_mag));
  R.dh_f32 = make_budget(R.r64.dh, to_double(R.r32.dh), DType::kF32, test::max_abs(dh_mag));
  R.dw = make_budget(R.dw64, to_double(dw32), DType::kF32, test::max_abs(dw_mag));
  const test::ErrorBudget logits =
      make_budget(R.r64.logits, to_double(R.r32.logits), DType::kF32);
  R.logit_tol = logits.tol();
  return R;
}

void check_argmax(const Problem& p, const Reference& R, const std::vector<int32_t>& argmax) {
  const int64_t v = p.shape.vocab;
  int64_t bad = 0;
  for (int64_t t = 0; t < p.shape.tokens; ++t) {
    const double* row = &R.r64.logits[t * v];
    const int32_t a = argmax[t];
    const bool ok = a >= 0 && a < v && row[a] >= row[R.r64.argmax[t]] - 2 * R.logit_tol;
    if (!ok && bad++ < 5)
      ADD_FAILURE() << "argmax[" << t << "] = " << a << ", reference " << R.r64.argmax[t];
  }
  EXPECT_EQ(bad, 0) << "rows whose argmax is not a maximum of the reference logits";
}

class LmHeadLossTest : public ::testing::TestWithParam<LossCase> {};

TEST_P(LmHeadLossTest, ForwardBackwardMatchesUnfusedReference) {
  const Problem p = make_problem(GetParam(), 51);
  const LmHeadLossShape& s = p.shape;
  auto dev = test::cpu();
  const KernelResult k = run_kernel(*dev, p, /*backward=*/true);
  const Reference R = reference(p);

  EXPECT_EQ(k.sums.count, R.r64.count);
  EXPECT_EQ(k.sums.count, p.labelled);
  EXPECT_TRUE(expect_close("loss_sum", {k.sums.loss_sum}, {R.r64.loss_sum}, R.loss, {1}));
  check_argmax(p, R, k.argmax);
  EXPECT_TRUE(expect_close("loss dh", k.dh, R.r64.dh, R.dh, {s.tokens, s.dim}));
  if (s.dtype == DType::kBF16) {
    EXPECT_TRUE(test::expect_rounded_once("loss dh", k.dh, R.r64.dh, R.dh_f32, {s.tokens, s.dim}));
  }
  EXPECT_TRUE(expect_close("loss dw (+=)", k.dw, R.dw64, R.dw, {s.vocab, s.dim}));
  EXPECT_EQ(k.dh_padding_changed, 0);
  // Rows without a label have exactly zero gradient.
  for (int64_t t = 0; t < s.tokens; ++t) {
    if (p.labels[t] != kIgnore) continue;
    for (int64_t i = 0; i < s.dim; ++i) ASSERT_EQ(k.dh[t * s.dim + i], 0.0) << "dh[" << t << "," << i << "]";
  }
  if (p.labelled == 0) {
    EXPECT_EQ(k.sums.loss_sum, 0.0);
    EXPECT_EQ(k.dw, test::stored_as(p.dw0, DType::kF32)) << "dw changed without any label";
  }
}

// The evaluation variant returns the same loss and argmax as the training call, bit for bit
// (the same logits), and writes no gradient.
TEST_P(LmHeadLossTest, ForwardOnlyMatchesForwardBackward) {
  const Problem p = make_problem(GetParam(), 52);
  auto dev = test::cpu();
  const KernelResult fb = run_kernel(*dev, p, /*backward=*/true);
  const KernelResult f = run_kernel(*dev, p, /*backward=*/false);
  EXPECT_EQ(f.sums.loss_sum, fb.sums.loss_sum);
  EXPECT_EQ(f.sums.count, fb.sums.count);
  EXPECT_EQ(f.argmax, fb.argmax);
  EXPECT_EQ(f.dw, test::stored_as(p.dw0, DType::kF32));
}

INSTANTIATE_TEST_SUITE_P(Cases, LmHeadLossTest, ::testing::ValuesIn(loss_cases()),
                         [](const auto& info) { return info.param.name; });

// sums and dw accumulate: two calls over the two halves of the tokens equal one call over all
// (up to the order of fp32 additions into dw and of the fp64 loss sum).
TEST(LmHeadLoss, SumsAndDwAccumulateAcrossCalls) {
  const Problem p = make_problem({.name = "acc", .tokens = 24, .dim = 32, .vocab = 64, .chunk = 5}, 53);
  const LmHeadLossShape& s = p.shape;
  auto dev = test::cpu();
  const KernelResult whole = run_kernel(*dev, p, true);

  std::vector<float> h = to_float(p.h), w = to_float(p.w), dw = to_float(p.dw0);
  std::vector<float> dh(static_cast<size_t>(s.tokens * s.dim));
  LossSums sums;
  LmHeadLossShape half = s;
  half.tokens = 12;
  for (int64_t t0 : {0, 12})
    lm_head_loss_forward_backward(*dev, half, &sums, nullptr, dh.data() + t0 * s.dim, dw.data(),
                                  h.data() + t0 * s.dim, p.labels.data() + t0, w.data());
  EXPECT_EQ(sums.count, whole.sums.count);
  const Reference R = reference(p);  // other chunk boundaries: other GEMM shapes, other roundings
  EXPECT_TRUE(expect_close("loss_sum over two calls", {sums.loss_sum}, {R.r64.loss_sum}, R.loss, {1}));
  EXPECT_TRUE(expect_close("dw over two calls", to_double(dw), R.dw64, R.dw, {s.vocab, s.dim}));
  EXPECT_TRUE(expect_close("dh over two calls", to_double(dh), R.r64.dh, R.dh, {s.tokens, s.dim}));
}

// A chunk without any label (and no argmax asked for) skips its GEMMs: dh rows 0, dw untouched.
TEST(LmHeadLoss, AllIgnoredWithoutArgmaxWritesZeroDh) {
  const Problem p = make_problem({.name = "skip", .tokens = 9, .dim = 16, .vocab = 30, .chunk = 4,
                                  .ignored = 1.0, .dtype = DType::kBF16}, 55);
  const LmHeadLossShape& s = p.shape;
  auto dev = test::cpu();
  Stored h(s.dtype, s.tokens, s.dim, s.dim, Stored::Pad::kNaN);
  h.set(p.h);
  std::vector<float> w = to_float(p.w), dw = to_float(p.dw0);
  Stored dh(s.dtype, s.tokens, s.dim, s.dim, Stored::Pad::kSentinel);
  dh.fill_view_nan();
  LossSums sums;
  lm_head_loss_forward_backward(*dev, s, &sums, nullptr, dh.data(), dw.data(), h.data(),
                                p.labels.data(), w.data());
  EXPECT_EQ(sums.count, 0);
  EXPECT_EQ(sums.loss_sum, 0.0);
  for (double v : dh.get()) ASSERT_EQ(v, 0.0);
  EXPECT_EQ(dh.padding_changed(), 0);
  EXPECT_EQ(to_double(dw), test::stored_as(p.dw0, DType::kF32));
}

// ---- memory ---------------------------------------------------------------------------------

int64_t other_peak(Device& dev, const LmHeadLossShape& s, bool backward) {
  LossSums sums;
  dev.allocator().reset_peaks();
  if (backward)
    lm_head_loss_forward_backward(dev, s, &sums, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  else
    lm_head_loss_forward(dev, s, &sums, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(dev.allocator().stats().live[static_cast<int>(Tag::kOther)], 0);
  return dev.allocator().stats().peak[static_cast<int>(Tag::kOther)];
}

// The loss's workspace is the documented chunk-bounded set: the same at 1000 and at 1,000,000
// tokens, and equal to lm_head_loss_workspace_bytes (what the memory planner uses).
TEST(LmHeadLossMemory, PeakDoesNotGrowWithTokens) {
  auto dev = test::rehearsal();
  for (DType t : {DType::kF32, DType::kBF16})
    for (bool backward : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (backward ? " forward_backward" : " forward"));
      LmHeadLossShape s{.tokens = 1000, .dim = 2048, .vocab = 32000, .chunk_tokens = 128,
                        .dtype = t, .weight_dtype = t};
      const int64_t small = other_peak(*dev, s, backward);
      s.tokens = 1000000;
      const int64_t large = other_peak(*dev, s, backward);
      EXPECT_EQ(small, large);
      EXPECT_EQ(large, lm_head_loss_workspace_bytes(s, backward));
      // logits 128 x 32000 fp32 + row losses + (bf16) h, dh in fp32 + one 16 MiB w block.
      const int64_t want = 128 * 32000 * 4 + 128 * 8 +
                           (t == DType::kBF16 ? 128 * 2048 * 4 * (backward ? 2 : 1) + (16 << 20) : 0);
      EXPECT_EQ(large, want);
      std::printf("[  bytes   ] loss workspace %s %s: %lld B at 1e3 and 1e6 tokens\n",
                  std::string(dtype_name(t)).c_str(), backward ? "fwd+bwd" : "fwd",
                  static_cast<long long>(large));
    }
  // Default chunk: the largest with chunk * V * 4 <= 64 MiB.
  const LmHeadLossShape d{.tokens = 1 << 20, .dim = 4096, .vocab = 151936};
  const int64_t chunk = lm_head_loss_chunk(d);
  EXPECT_LE(chunk * d.vocab * 4, int64_t{64} << 20);
  EXPECT_GT((chunk + 1) * d.vocab * 4, int64_t{64} << 20);
  EXPECT_EQ(other_peak(*dev, d, true), lm_head_loss_workspace_bytes(d, true));
}

// A real run allocates exactly what the rehearsal counts.
TEST(LmHeadLossMemory, RealRunAllocatesWhatRehearsalCounts) {
  for (const LossCase& c : {LossCase{.name = "f32", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 5},
                            LossCase{.name = "bf16", .tokens = 30, .dim = 40, .vocab = 90, .chunk = 10,
                                     .dtype = DType::kBF16, .weight_dtype = DType::kBF16}}) {
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c, 54);
    auto real = test::cpu();
    real->allocator().reset_peaks();
    run_kernel(*real, p, true);
    auto counted = test::rehearsal();
    EXPECT_EQ(real->allocator().stats().peak[static_cast<int>(Tag::kOther)],
              other_peak(*counted, p.shape, true));
    EXPECT_EQ(real->allocator().stats().peak[static_cast<int>(Tag::kOther)],
              lm_head_loss_workspace_bytes(p.shape, true));
  }
}

// ---- bad input ------------------------------------------------------------------------------

TEST(LmHeadLoss, BadLabelIsRejectedBeforeAnyWrite) {
  const LmHeadLossShape s{.tokens = 6, .dim = 4, .vocab = 10, .chunk_tokens = 2};
  auto dev = test::cpu();
  std::vector<float> h(24, 0.5f), w(40, 0.25f);
  for (int32_t bad : {10, -1, -99, 1000000}) {
    SCOPED_TRACE(bad);
    std::vector<int32_t> labels = {0, kIgnore, 9, 3, bad, 5};  // chunks before it are valid
    std::vector<float> dh(24, -7.0f), dw(40, -7.0f);
    std::vector<int32_t> argmax(6, -7);
    LossSums sums{.loss_sum = 1.5, .count = 3};
    const std::string field = "labels[4] = " + std::to_string(bad);
    test::expect_invalid([&] {
      lm_head_loss_forward_backward(*dev, s, &sums, argmax.data(), dh.data(), dw.data(), h.data(),
                                    labels.data(), w.data());
    }, field);
    test::expect_invalid([&] {
      lm_head_loss_forward(*dev, s, &sums, argmax.data(), h.data(), labels.data(), w.data());
    }, field);
    for (float v : dh) EXPECT_EQ(v, -7.0f) << "dh written before the label check";
    for (float v : dw) EXPECT_EQ(v, -7.0f) << "dw written before the label check";
    for (int32_t v : argmax) EXPECT_EQ(v, -7) << "argmax written before the label check";
    EXPECT_EQ(sums.loss_sum, 1.5);
    EXPECT_EQ(sums.count, 3);
  }
}

TEST(LmHeadLossValidate, RejectsBadShapesNamingTheField) {
  const LmHeadLossShape good{.tokens = 4, .dim = 8, .vocab = 16};
  EXPECT_NO_THROW(validate(good));
  auto with = [&](auto edit) {
    LmHeadLossShape s = good;
    edit(s);
    return [s] { validate(s); };
  };
  test::expect_invalid(with([](LmHeadLossShape& s) { s.tokens = -1; }), "tokens");
  test::expect_invalid(with([](LmHeadLossShape& s) { s.dim = 0; }), "dim");
  test::expect_invalid(with([](LmHeadLossShape& s) { s.vocab = 0; }), "vocab");
  test::expect_invalid(with([](LmHeadLossShape& s) { s.vocab = -5; }), "vocab");
  test::expect_invalid(with([](LmHeadLossShape& s) { s.chunk_tokens = -1; }), "chunk_tokens");
  test::expect_invalid(with([](LmHeadLossShape& s) { s.ignore_index = 3; }), "ignore_index");
  test::expect_invalid(with([](LmHeadLossShape& s) { s.grad_scale = std::nanf(""); }), "grad_scale");
  test::expect_invalid(with([](LmHeadLossShape& s) { s.dtype = DType::kI32; }), "dtype");
  test::expect_invalid(with([](LmHeadLossShape& s) { s.weight_dtype = DType::kF64; }), "weight_dtype");
  auto dev = test::cpu();
  test::expect_invalid([&] {
    lm_head_loss_forward_backward(*dev, good, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  }, "sums");
  // Zero tokens: a no-op.
  LossSums sums;
  EXPECT_NO_THROW(lm_head_loss_forward_backward(*dev, {.tokens = 0, .dim = 8, .vocab = 16}, &sums, nullptr,
                                                nullptr, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(sums.count, 0);
}

}  // namespace
}  // namespace untied

#include "kernels/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

namespace untied::test {

double elem_error(double a, double b) {
  if (std::isfinite(a) && std::isfinite(b)) return std::fabs(a - b);
  if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) return 0.0;
  return std::numeric_limits<double>::infinity();  // NaN, or finite vs infinite
}

double max_abs_error(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, elem_error(a[i], b[i]));
  return m;
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

std::vector<double> stored_as(const std::vector<double>& x, DType t) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    float f = static_cast<float>(x[i]);
    y[i] = t == DType::kBF16 ? round_to_bf16(f) : f;
  }
  return y;
}

ErrorBudget make_budget(const std::vector<double>& ref, const std::vector<double>& naive_f32,
                        DType storage, double magnitude) {
  ErrorBudget b;
  b.baseline = std::max(max_abs_error(naive_f32, ref), max_abs_error(stored_as(ref, storage), ref));
  b.floor = kFloorUlps * FLT_EPSILON * (magnitude >= 0 ? magnitude : max_abs(ref));
  return b;
}

namespace {
std::string multi_index(int64_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> idx(dims.size());
  for (size_t d = dims.size(); d-- > 0;) {
    idx[d] = flat % dims[d];
    flat /= dims[d];
  }
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? "," : "") << idx[d];
  os << "]";
  return os.str();
}

// Compares element by element against a per-element tolerance; on failure reports the count,
// the max error and the first few mismatches with their multi-index.
template <typename TolFn>
::testing::AssertionResult check_elements(const std::string& what,
                                          const std::vector<double>& actual,
                                          const std::vector<double>& expected, TolFn tol_of,
                                          const std::vector<int64_t>& dims, double* max_err_out) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << what << ": size " << actual.size()
                                         << " vs expected " << expected.size();
  double max_err = 0;
  int64_t arg_max = -1, bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double e = elem_error(actual[i], expected[i]);
    if (arg_max < 0 || e > max_err) {  // elem_error is never NaN (non-finite pairs give +inf)
      max_err = e;
      arg_max = static_cast<int64_t>(i);
    }
    const double tol = tol_of(i);
    if (!(e <= tol)) {
      if (bad < 8)
        first << "\n    " << multi_index(static_cast<int64_t>(i), dims) << " got " << actual[i]
              << " want " << expected[i] << " (err " << e << ", tol " << tol << ")";
      ++bad;
    }
  }
  *max_err_out = max_err;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << actual.size() << " elements exceed their tolerance; "
         << "max err " << max_err << " at " << multi_index(arg_max < 0 ? 0 : arg_max, dims)
         << "; first mismatches:" << first.str();
}

// The spacing of bf16 values in the binade of |x| (8 significant bits).
double bf16_ulp(double x) {
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = m 2^e, m in [0.5, 1)
  return x == 0 ? 0.0 : std::ldexp(1.0, e - 8);
}

}  // namespace

::testing::AssertionResult expect_close(const std::string& what, const std::vector<double>& actual,
                                        const std::vector<double>& expected,
                                        const ErrorBudget& budget,
                                        const std::vector<int64_t>& dims) {
  const double tol = budget.tol();
  double max_err = 0;
  auto r = check_elements(what, actual, expected, [tol](size_t) { return tol; }, dims, &max_err);
  std::printf("[   err    ] %-28s max err %.3e  tol %.3e = %g x baseline %.3e + floor %.3e\n",
              what.c_str(), max_err, tol, kErrFactor, budget.baseline, budget.floor);
  if (!r) r << "\n  tol " << tol << " = " << kErrFactor << " x baseline " << budget.baseline
            << " + floor " << budget.floor;
  return r;
}

::testing::AssertionResult expect_rounded_once(const std::string& what,
                                               const std::vector<double>& actual,
                                               const std::vector<double>& expected,
                                               const ErrorBudget& f32_budget,
                                               const std::vector<int64_t>& dims) {
  const double tol32 = f32_budget.tol();
  auto tol_of = [&](size_t i) {
    if (!std::isfinite(expected[i])) return 0.0;
    return tol32 + 0.5 * bf16_ulp(std::fabs(expected[i]) + tol32);
  };
  double max_err = 0;
  auto r = check_elements(what + " (bf16, rounded once)", actual, expected, tol_of, dims, &max_err);
  std::printf("[   err    ] %-28s max err %.3e  per element: half a bf16 ulp + fp32 tol %.3e\n",
              (what + " rounding").c_str(), max_err, tol32);
  return r;
}

std::vector<double> random_values(std::mt19937_64& rng, int64_t n, DType t, double sigma) {
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return stored_as(x, t);
}

// ---- Stored --------------------------------------------------------------------------------

Stored::Stored(DType dtype, int64_t rows, int64_t cols, int64_t stride, Pad pad)
    : dtype_(dtype), rows_(rows), cols_(cols), stride_(stride), pad_(pad) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(rows * stride, 1));
  if (dtype_ == DType::kF32) f32_.resize(n); else b16_.resize(n);
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t c = 0; c < stride_; ++c) {
      const int64_t i = r * stride_ + c;
      if (c < cols_) { put(i, 0.0f); continue; }
      uint32_t p = pad_bits(i);
      if (dtype_ == DType::kF32) std::memcpy(&f32_[i], &p, 4);
      else b16_[i] = bf16{static_cast<uint16_t>(p)};
    }
}

uint32_t Stored::pad_bits(int64_t i) const {
  // A quiet NaN (inputs: reading it into a result poisons the result) or a plain sentinel
  // value (outputs), with the element index mixed in so that a shifted write is also caught.
  if (dtype_ == DType::kF32)
    return pad_ == Pad::kNaN ? 0x7fc00000u | static_cast<uint32_t>(i & 0xffff)
                             : 0x449a0000u | static_cast<uint32_t>(i & 0xffff);
  return pad_ == Pad::kNaN ? 0x7fc0u | static_cast<uint32_t>(i & 0x3f)
                           : 0x4490u | static_cast<uint32_t>(i & 0x0f);
}

uint32_t Stored::bits(int64_t i) const {
  if (dtype_ == DType::kF32) {
    uint32_t u;
    std::memcpy(&u, &f32_[i], 4);
    return u;
  }
  return b16_[i].bits;
}

void Stored::set(const std::vector<double>& dense) {
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t c = 0; c < cols_; ++c)
      put(r * stride_ + c, static_cast<float>(dense[r * cols_ + c]));
}

void Stored::fill_view_nan() {
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t c = 0; c < cols_; ++c) put(r * stride_ + c, std::nanf(""));
}

std::vector<double> Stored::get() const {
  std::vector<double> out(static_cast<size_t>(rows_ * cols_));
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t c = 0; c < cols_; ++c) out[r * cols_ + c] = at(r * stride_ + c);
  return out;
}

int64_t Stored::padding_changed() const {
  int64_t n = 0;
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t c = cols_; c < stride_; ++c) {
      const int64_t i = r * stride_ + c;
      n += bits(i) != pad_bits(i);
    }
  return n;
}

}  // namespace untied::test

// The comparisons of compare.h.
#include "common/compare.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

namespace untied::test {

double elem_error(double a, double b) {
  if (std::isfinite(a) && std::isfinite(b)) return std::fabs(a - b);
  if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) return 0.0;
  return std::numeric_limits<double>::infinity();  // NaN, or finite vs infinite, or opposite infinities
}

double max_abs_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, elem_error(a[i], b[i]));
  return m;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

double rel_error(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& ref) {
  const double mx = max_abs(ref);
  return max_abs_error(a, b) / (mx > 0 ? mx : 1.0);
}

namespace {

std::string multi_index(int64_t flat, const std::vector<int64_t>& dims) {
  if (dims.empty()) {
    std::string s = "[";  // built with append: GCC 12 warns falsely on "[" + std::to_string(...)
    s.append(std::to_string(flat));
    s += ']';
    return s;
  }
  std::vector<int64_t> idx(dims.size());
  for (size_t d = dims.size(); d-- > 0;) {
    idx[d] = dims[d] > 0 ? flat % dims[d] : 0;
    flat = dims[d] > 0 ? flat / dims[d] : 0;
  }
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? "," : "") << idx[d];
  os << "]";
  return os.str();
}

// The one element loop behind every tolerance check: counts the elements over their bound,
// keeps the largest error and the first mismatches.
::testing::AssertionResult check_elements(const std::string& what, const std::vector<double>& actual,
                                          const std::vector<double>& expected,
                                          const std::function<double(size_t)>& tol_of, const CheckOptions& opts,
                                          const std::string& tol_text) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << what << ": " << actual.size() << " elements, expected " << expected.size();
  double max_err = 0;
  int64_t arg_max = -1, bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double e = elem_error(actual[i], expected[i]);  // never NaN
    if (arg_max < 0 || e > max_err) {
      max_err = e;
      arg_max = static_cast<int64_t>(i);
    }
    const double tol = tol_of(i);
    if (!(e <= tol)) {
      if (bad < 8)
        first << "\n    " << multi_index(static_cast<int64_t>(i), opts.dims) << " got " << actual[i] << " want "
              << expected[i] << " (err " << e << ", tol " << tol << ")";
      ++bad;
    }
  }
  if (opts.print)
    std::printf("[   err    ] %-44s max err %.3e  tol %s%s%s%s\n", what.c_str(), max_err, tol_text.c_str(),
                opts.note.empty() ? "" : " (", opts.note.c_str(), opts.note.empty() ? "" : ")");
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << actual.size()
                                       << " elements exceed their tolerance (" << tol_text
                                       << (opts.note.empty() ? "" : "; ") << opts.note << "); max err " << max_err
                                       << " at " << multi_index(arg_max < 0 ? 0 : arg_max, opts.dims)
                                       << "; first mismatches:" << first.str();
}

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", x);
  return buf;
}

}  // namespace

::testing::AssertionResult expect_close(const std::string& what, const std::vector<double>& actual,
                                        const std::vector<double>& expected, double tol, const CheckOptions& opts) {
  return check_elements(
      what, actual, expected, [tol](size_t) { return tol; }, opts, number(tol));
}

::testing::AssertionResult expect_close_each(const std::string& what, const std::vector<double>& actual,
                                             const std::vector<double>& expected,
                                             const std::function<double(size_t)>& tol_of, const CheckOptions& opts) {
  return check_elements(what, actual, expected, tol_of, opts, "per element");
}

::testing::AssertionResult expect_rel_close(const std::string& what, const std::vector<double>& actual,
                                            const std::vector<double>& expected, double rel) {
  const double mx = max_abs(expected);
  const double tol = rel * (mx > 0 ? mx : 1.0);
  CheckOptions o;
  o.print = false;
  o.note = number(rel) + " x max|expected| " + number(mx);
  return check_elements(
      what, actual, expected, [tol](size_t) { return tol; }, o, number(tol));
}

std::vector<double> stored_as(const std::vector<double>& x, DType t) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float f = static_cast<float>(x[i]);
    y[i] = t == DType::kBF16 ? round_to_bf16(f) : f;
  }
  return y;
}

ErrorBudget make_budget(const std::vector<double>& ref, const std::vector<double>& naive_f32, DType storage,
                        double magnitude) {
  ErrorBudget b;
  b.baseline = std::max(max_abs_error(naive_f32, ref), max_abs_error(stored_as(ref, storage), ref));
  b.floor = kFloorUlps * FLT_EPSILON * (magnitude >= 0 ? magnitude : max_abs(ref));
  return b;
}

::testing::AssertionResult expect_close(const std::string& what, const std::vector<double>& actual,
                                        const std::vector<double>& expected, const ErrorBudget& budget,
                                        const std::vector<int64_t>& dims) {
  char note[128];
  std::snprintf(note, sizeof note, "%g x baseline %.3e + floor %.3e", kErrFactor, budget.baseline, budget.floor);
  return expect_close(what, actual, expected, budget.tol(), CheckOptions{.dims = dims, .note = note});
}

double bf16_ulp(double x) {
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = m 2^e, m in [0.5, 1)
  return x == 0 ? 0.0 : std::ldexp(1.0, e - 8);
}

::testing::AssertionResult expect_rounded_once(const std::string& what, const std::vector<double>& actual,
                                               const std::vector<double>& expected, const ErrorBudget& f32_budget,
                                               const std::vector<int64_t>& dims) {
  const double tol32 = f32_budget.tol();
  auto tol_of = [&](size_t i) {
    if (!std::isfinite(expected[i])) return 0.0;
    return tol32 + 0.5 * bf16_ulp(std::fabs(expected[i]) + tol32);
  };
  char note[96];
  std::snprintf(note, sizeof note, "half a bf16 ulp + fp32 tol %.3e", tol32);
  return expect_close_each(what + " (bf16, rounded once)", actual, expected, tol_of,
                           CheckOptions{.dims = dims, .note = note});
}

::testing::AssertionResult expect_rounded_once_after_bf16_operands(const std::string& what,
                                                                   const std::vector<double>& actual,
                                                                   const std::vector<double>& expected,
                                                                   const ErrorBudget& f32_budget,
                                                                   const std::vector<double>& term_mag,
                                                                   const std::vector<int64_t>& dims) {
  if (term_mag.size() != expected.size())
    return ::testing::AssertionFailure() << what << ": " << term_mag.size() << " term magnitudes for "
                                         << expected.size() << " elements";
  const double tol32 = f32_budget.tol();
  auto tol_of = [&](size_t i) {
    if (!std::isfinite(expected[i])) return 0.0;
    const double before = tol32 + std::ldexp(term_mag[i], -8);  // error before the output's rounding
    return before + 0.5 * bf16_ulp(std::fabs(expected[i]) + before);
  };
  char note[128];
  std::snprintf(note, sizeof note, "half a bf16 ulp + 2^-8 of the terms + fp32 tol %.3e", tol32);
  return expect_close_each(what + " (bf16, operands rounded, output rounded once)", actual, expected, tol_of,
                           CheckOptions{.dims = dims, .note = note});
}

::testing::AssertionResult expect_same_values(const std::string& what, const std::vector<double>& actual,
                                              const std::vector<double>& expected) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << what << ": " << actual.size() << " elements, expected " << expected.size();
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < actual.size(); ++i) {
    const bool same = (std::isnan(actual[i]) && std::isnan(expected[i])) ||
                      std::memcmp(&actual[i], &expected[i], sizeof(double)) == 0;
    if (!same) {
      if (bad < 5) first << "\n    [" << i << "] got " << actual[i] << " want " << expected[i];
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << actual.size()
                                       << " elements differ, first:" << first.str();
}

int64_t count_identical(const std::vector<double>& a, const std::vector<double>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], sizeof(double)) == 0;
  return n;
}

bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && count_identical(a, b) == static_cast<int64_t>(a.size());
}

}  // namespace untied::test

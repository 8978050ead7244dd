// The comparisons every test uses (tests/common, library untied_test_common): one rule for
// non-finite values, tolerance checks against a single bound or a per-element bound, the
// derived budgets of the kernel tests (tol = k x baseline + floor), and exact checks.
//
// The rule, for every check here:
//   elem_error(a, b) = |a - b|   when both are finite,
//                      0         when both are the same infinity (+inf and +inf, -inf and -inf),
//                      +inf      otherwise: NaN on either side (NaN against NaN too), an infinity
//                                against a finite value or against the other infinity.
//   A tolerance check passes element i iff elem_error(actual_i, expected_i) <= tol_i. So a NaN
//   anywhere fails it, and an infinity passes only against the same infinity.
//   An exact check (same_values) passes element i iff both have the same bits or both are NaN
//   (any payload); +0 and -0 differ. A byte check (the op test's untouched bytes) compares raw
//   bytes, NaN payloads included.
// Sizes that differ fail every check.
//
// A failing check names what was compared, the count of elements over their bound, the largest
// error and the first mismatches (with their multi-index when `dims` is given).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "untied/core/dtype.h"

namespace untied::test {

// ---- the rule ------------------------------------------------------------------------------

double elem_error(double a, double b);
// max_i elem_error(a_i, b_i); +inf when the sizes differ; 0 for empty vectors.
double max_abs_error(const std::vector<double>& a, const std::vector<double>& b);
// max |x_i| over the finite elements (0 when there are none).
double max_abs(const std::vector<double>& x);
// max_abs_error(a, b) / max_abs(ref), or / 1 where ref is all zeros (or has no finite element).
double rel_error(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& ref);

// ---- tolerance checks ----------------------------------------------------------------------

struct CheckOptions {
  std::vector<int64_t> dims{};  // row-major shape, only to print the multi-index of mismatches
  std::string note{};           // how the tolerance was derived (printed with the figures)
  bool print = true;            // one line with the measured error and the tolerance, pass or fail
};

// max_i elem_error(actual_i, expected_i) <= tol.
::testing::AssertionResult expect_close(const std::string& what, const std::vector<double>& actual,
                                        const std::vector<double>& expected, double tol, const CheckOptions& opts = {});
// elem_error(actual_i, expected_i) <= tol_of(i) for every i.
::testing::AssertionResult expect_close_each(const std::string& what, const std::vector<double>& actual,
                                             const std::vector<double>& expected,
                                             const std::function<double(size_t)>& tol_of,
                                             const CheckOptions& opts = {});
// max_i elem_error(actual_i, expected_i) <= rel * max|expected| (finite elements; rel alone where
// expected is all zeros). Prints nothing on success.
::testing::AssertionResult expect_rel_close(const std::string& what, const std::vector<double>& actual,
                                            const std::vector<double>& expected, double rel);

// ---- derived budgets (STYLE.md habit 8) ----------------------------------------------------
//
// A tensor's tolerance against its fp64 reference is tol = k * baseline + floor, where the
// baseline is the error a straightforward computation at the kernel's precision makes against
// the same reference (measured by the caller), and the floor covers a baseline that happens to
// be ~0 (a row that sees one key: the naive fp32 result is exact, while a kernel that multiplies
// by 1/l instead of dividing by l, or cancels the same O(1) terms summed in another order, is
// off by an ulp of those terms).

// k: how many times the naive computation's error the kernel may make. 4 because the kernels
// differ from the naive loop in ways that each cost about one extra rounding per element, not a
// different error growth: blocked (tiled) summation instead of one sequential sum, an online
// softmax that rescales the running sum and output once per key tile, exp evaluated as exp2 of a
// pre-scaled score (one more rounding of the scaled score), fused multiply-adds, and (bf16)
// rounding a value that already carries fp32 error. Each of those is bounded by the same
// eps-per-operation model as the naive loop; 4x leaves room for them without hiding a wrong
// formula, which errs by O(magnitude), i.e. 10^4..10^6 times the baseline.
inline constexpr double kErrFactor = 4.0;

// Floor in units of FLT_EPSILON * magnitude, where magnitude is the largest sum of |terms| behind
// an element (max|reference| for results that are not sums): one rounding of a partial sum costs
// at most FLT_EPSILON/2 * magnitude; 2 FLT_EPSILON allows four such roundings (a different
// summation order, a rescale, the final division, the store) even where the result itself
// cancels to ~0 and the naive baseline happens to be exact.
inline constexpr double kFloorUlps = 2.0;

struct ErrorBudget {
  double baseline = 0;  // error of the naive low-precision computation vs fp64
  double floor = 0;     // absolute floor (kFloorUlps * FLT_EPSILON * magnitude)
  double tol() const { return kErrFactor * baseline + floor; }
};

// Each element rounded as storing it in `t` would (f32: to float; bf16: to bf16).
std::vector<double> stored_as(const std::vector<double>& x, DType t);

// The budget for a tensor whose fp64 reference is `ref`: baseline is the larger of the naive
// fp32 reference's error and the error of storing `ref` itself in `storage` (for bf16 outputs
// the latter dominates: no kernel can do better than rounding the exact result once).
// floor = kFloorUlps * FLT_EPSILON * magnitude, where magnitude is max|ref| by default, or,
// for results that are sums with cancellation, the largest sum of |terms| (pass it): a
// different summation order is off by a few ulps of the terms, not of the (small) result.
ErrorBudget make_budget(const std::vector<double>& ref, const std::vector<double>& naive_f32, DType storage,
                        double magnitude = -1);

// max |actual - expected| <= budget.tol(); prints the figures (the numbers quoted in reports).
::testing::AssertionResult expect_close(const std::string& what, const std::vector<double>& actual,
                                        const std::vector<double>& expected, const ErrorBudget& budget,
                                        const std::vector<int64_t>& dims);

// For outputs stored in bf16 by kernels that compute in fp32 and round once: element i must be
// within tol32 + half a bf16 ulp of |expected_i| + tol32, where tol32 = f32_budget.tol() is the
// fp32 budget of the same computation (make_budget with storage kF32). This is per element and
// much tighter than 4 x (max rounding error): a kernel that truncates instead of rounding to
// nearest, rounds twice, or keeps a bf16 intermediate is off by up to a whole ulp somewhere.
::testing::AssertionResult expect_rounded_once(const std::string& what, const std::vector<double>& actual,
                                               const std::vector<double>& expected, const ErrorBudget& f32_budget,
                                               const std::vector<int64_t>& dims);

// The same for kernels that also round one operand of each product to bf16 before the product (P
// and dS in flash attention on tensor cores or AMX, as FlashAttention does): each term's rounded
// factor errs by at most 2^-8 of itself (round to nearest with 8 significant bits: the unit
// roundoff 2^-8), so element i may be off by 2^-8 term_mag[i] more, term_mag[i] being the sum of
// |terms| behind it.
::testing::AssertionResult expect_rounded_once_after_bf16_operands(const std::string& what,
                                                                   const std::vector<double>& actual,
                                                                   const std::vector<double>& expected,
                                                                   const ErrorBudget& f32_budget,
                                                                   const std::vector<double>& term_mag,
                                                                   const std::vector<int64_t>& dims);

// The spacing of bf16 values in the binade of |x| (8 significant bits); 0 for x = 0.
double bf16_ulp(double x);

// ---- exact checks --------------------------------------------------------------------------

// Element-wise identity: the same bits, or NaN on both sides.
::testing::AssertionResult expect_same_values(const std::string& what, const std::vector<double>& actual,
                                              const std::vector<double>& expected);
// Number of elements with the same bits (doubles holding exact float values).
int64_t count_identical(const std::vector<double>& a, const std::vector<double>& b);
// Every element bitwise identical, and the sizes agree.
bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b);

inline std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }
inline std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

}  // namespace untied::test

// Helpers shared by the kernel tests: random inputs that are exact in the storage type, strided
// storage buffers with guarded padding, and the one comparison every kernel test uses.
//
// The comparison (expect_close) implements STYLE.md habits 7 and 8: the tolerance of a tensor is
//     tol = k * baseline + floor
// where `baseline` is the error a straightforward computation at the kernel's precision makes
// against the fp64 reference (measured by the caller, see ErrorBudget), and `floor` covers the
// case where that baseline happens to be ~0 (e.g. a row that sees one key: the naive fp32
// result is exact, while a kernel that multiplies by 1/l instead of dividing by l, or that
// cancels the same O(1) terms summed in another order, is off by an ulp of those terms).
// A failure prints the max error, the budget it was measured against, how many elements exceed
// it and the first few of them with their multi-index.
#pragma once

#include <gtest/gtest.h>

#include <cfloat>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "untied/core/dtype.h"

namespace untied::test {

// ---- tolerances ---------------------------------------------------------------------------

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

// max |a - b| over elements, with the convention that equal infinities (e.g. lse = -inf for a
// row that sees no key) have error 0 and any other non-finite pair has error +inf.
double elem_error(double a, double b);
double max_abs_error(const std::vector<double>& a, const std::vector<double>& b);
double max_abs(const std::vector<double>& a);  // over finite elements

// Each element rounded as storing it in `t` would (f32: to float; bf16: to bf16).
std::vector<double> stored_as(const std::vector<double>& x, DType t);

// The budget for a tensor whose fp64 reference is `ref`: baseline is the larger of the naive
// fp32 reference's error and the error of storing `ref` itself in `storage` (for bf16 outputs
// the latter dominates: no kernel can do better than rounding the exact result once).
// floor = kFloorUlps * FLT_EPSILON * magnitude, where magnitude is max|ref| by default, or,
// for results that are sums with cancellation, the largest sum of |terms| (pass it): a
// different summation order is off by a few ulps of the terms, not of the (small) result.
ErrorBudget make_budget(const std::vector<double>& ref, const std::vector<double>& naive_f32,
                        DType storage, double magnitude = -1);

// Checks max |actual - expected| <= budget.tol(). `dims` (row-major) is used only to print the
// multi-index of mismatching elements. Prints one line with the measured errors either way
// (those lines are the numbers quoted in reports).
::testing::AssertionResult expect_close(const std::string& what, const std::vector<double>& actual,
                                        const std::vector<double>& expected,
                                        const ErrorBudget& budget,
                                        const std::vector<int64_t>& dims);

// For outputs stored in bf16 by kernels that compute in fp32 and round once (the contract of
// every kernel here): element i must be within tol32 + half a bf16 ulp of |expected_i| + tol32,
// where tol32 = f32_budget.tol() is the fp32 budget of the same computation (make_budget with
// storage kF32). This is per element and much tighter than 4 x (max rounding error): a kernel
// that truncates instead of rounding to nearest, rounds twice, or keeps a bf16 intermediate
// (P before P V, a dK partial per GQA head) is off by up to a whole ulp somewhere and fails.
::testing::AssertionResult expect_rounded_once(const std::string& what,
                                               const std::vector<double>& actual,
                                               const std::vector<double>& expected,
                                               const ErrorBudget& f32_budget,
                                               const std::vector<int64_t>& dims);

// ---- inputs -------------------------------------------------------------------------------

// n values from N(0, sigma^2), each exactly representable in `t` (rounded through it).
std::vector<double> random_values(std::mt19937_64& rng, int64_t n, DType t, double sigma = 1.0);

// ---- strided storage ----------------------------------------------------------------------

// A (rows, cols) matrix stored row-major in `dtype` with `stride` >= cols elements between rows.
// The padding (columns cols..stride-1) holds a sentinel pattern so tests can check that a
// kernel neither reads it into results (inputs: the pattern is NaN) nor writes it (outputs).
class Stored {
 public:
  enum class Pad { kNaN, kSentinel };
  Stored(DType dtype, int64_t rows, int64_t cols, int64_t stride, Pad pad);

  void* data() { return dtype_ == DType::kF32 ? static_cast<void*>(f32_.data()) : b16_.data(); }
  const void* data() const {
    return dtype_ == DType::kF32 ? static_cast<const void*>(f32_.data()) : b16_.data();
  }
  // Writes a dense (rows, cols) tensor into the view (each value rounded to dtype).
  void set(const std::vector<double>& dense);
  // Fills the view (not the padding) with NaN: outputs must be overwritten.
  void fill_view_nan();
  // The view as a dense (rows, cols) tensor.
  std::vector<double> get() const;
  // Number of padding elements whose bits differ from the initial pattern.
  int64_t padding_changed() const;

 private:
  float at(int64_t i) const { return dtype_ == DType::kF32 ? f32_[i] : bf16_to_float(b16_[i]); }
  void put(int64_t i, float x) {
    if (dtype_ == DType::kF32) f32_[i] = x; else b16_[i] = float_to_bf16(x);
  }
  uint32_t bits(int64_t i) const;
  uint32_t pad_bits(int64_t i) const;

  DType dtype_;
  int64_t rows_, cols_, stride_;
  Pad pad_;
  std::vector<float> f32_;
  std::vector<bf16> b16_;
};

}  // namespace untied::test

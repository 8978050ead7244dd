// Strided storage buffers with guarded padding, for the kernel tests (tests/kernels and
// tests/model_kernels). The comparisons and their budgets (expect_close, make_budget,
// expect_rounded_once) and the random inputs (random_values) are the shared ones of tests/common.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/random_inputs.h"
#include "untied/core/dtype.h"

namespace untied::test {

// ---- GEMM results -------------------------------------------------------------------------

// Checks C (m, n) with row stride ldc against alpha op(A) op(B) + beta C0 in fp64, element by
// element within 2 (k + 2) FLT_EPSILON x (the sum of |terms| behind it), the bound for an fp32
// dot product of length k; and that the padding between rows (columns n..ldc-1) is C0's, bit for
// bit. a(i, p) and b(p, j) give op(A) and op(B). Returns the elements out of bound (the first few
// are reported, with `label`).
int64_t check_gemm(const std::vector<float>& c, const std::vector<float>& c0, int64_t m, int64_t n, int64_t k,
                   int64_t ldc, float alpha, float beta, const std::function<double(int64_t, int64_t)>& a,
                   const std::function<double(int64_t, int64_t)>& b, const std::string& label);

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

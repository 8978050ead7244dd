// Stored: strided storage with guarded padding; check_gemm (test_util.h).
#include "kernels/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace untied::test {

// ---- check_gemm ----------------------------------------------------------------------------

int64_t check_gemm(const std::vector<float>& c, const std::vector<float>& c0, int64_t m, int64_t n, int64_t k,
                   int64_t ldc, float alpha, float beta, const std::function<double(int64_t, int64_t)>& a,
                   const std::function<double(int64_t, int64_t)>& b, const std::string& label) {
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (j >= n) {  // padding between rows is left alone
        const bool same = std::isnan(got) ? std::isnan(c0[i * ldc + j]) : got == c0[i * ldc + j];
        if (!same && bad++ < 3) ADD_FAILURE() << "padding written at (" << i << ", " << j << ") for " << label;
        continue;
      }
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double t = a(i, p) * b(p, j);
        s += t;
        mag += std::fabs(t);
      }
      const double cb = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c0[i * ldc + j];
      const double want = alpha * s + cb;
      const double bound = 2.0 * (k + 2) * FLT_EPSILON * (std::fabs(alpha) * mag + std::fabs(cb)) + 1e-30;
      if (!(std::fabs(got - want) <= bound) && bad++ < 3)
        ADD_FAILURE() << "C(" << i << ", " << j << ") = " << got << ", want " << want << " (bound " << bound << ") for "
                      << label;
    }
  return bad;
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

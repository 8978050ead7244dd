// Thin row-major wrapper over cblas_sgemm with 64-bit arguments (checked to fit BLAS ints).
// C (m, n) = alpha * op(A) op(B) + beta * C.
#pragma once

#include <cstdint>

namespace untied::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace untied::cpu

#include "kernels/cpu/sgemm.h"

#include <cblas.h>

#include <climits>

#include "untied/core/check.h"

namespace untied::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // BLAS takes 32-bit ints: split m into pieces if needed; n, k and the leading dims must fit.
  UNTIED_CHECK(n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
               "GEMM dimension over 2^31-1 (n=", n, ", k=", k, ", lda=", lda, ", ldb=", ldb,
               ", ldc=", ldc, ")");
  const int64_t kMaxRows = int64_t{1} << 30;
  for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int64_t rows = m - r0 < kMaxRows ? m - r0 : kMaxRows;
    const float* a0 = trans_a ? a + r0 : a + r0 * lda;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(rows), static_cast<int>(n),
                static_cast<int>(k), alpha, a0, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c + r0 * ldc, static_cast<int>(ldc));
  }
}

}  // namespace untied::cpu

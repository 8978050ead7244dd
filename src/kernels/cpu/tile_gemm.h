// The GEMM of the attention's tiles, our own register-blocked kernel instead of a BLAS call.
//
//   C (m, n) = alpha * op(A) B + beta * C        all fp32, row-major
//
//   op(A) = A, (m, k) with row stride lda;  or with trans_a, A^T where A is (k, m), row stride lda.
//   B is (k, n) with row stride ldb.  (For C = A B^T, transpose B into scratch first:
//   transpose_tile.)  beta = 0 never reads C, so C may hold anything, NaN included.
//
// Why not BLAS: the tiles are small (m, n, k of 64-256), and the calls run inside the
// attention's OpenMP regions, where a pthread BLAS oversubscribes the cores and a BLAS whose
// CPU detection fell back to generic kernels is several times slower; the kernel here is
// compiled for the build machine (-march=native) and needs neither. Accumulation order is
// fixed: for each element of C, k in increasing order, so results do not depend on threads.
//
// No allocation; thread-safe (no shared state); single-threaded (callers parallelize).
#pragma once

#include <cstdint>
#include <string>

namespace untied::cpu {

void tile_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// dst (cols, rows), row stride ldd = src (rows, cols)^T, src row stride lds.
void transpose_tile(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols);

// The kernel compiled in, e.g. "avx512 12x32": the vector ISA and the register block (rows x
// columns of C per step).
std::string tile_gemm_description();

}  // namespace untied::cpu

// GEMM on the CPU: BLAS sgemm, with bf16 operands widened to fp32 scratch.
#include "untied/kernels/gemm.h"

#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/sgemm.h"

namespace untied::cpu {
namespace {

// Copies a stored (rows, cols) matrix with row stride ld into contiguous fp32.
void widen(float* dst, const void* src, DType t, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t es = dtype_size(t);
  for (int64_t r = 0; r < rows; ++r)
    load_f32(dst + r * cols, static_cast<const char*>(src) + r * ld * es, t, cols);
}

}  // namespace

void gemm(Device& dev, const GemmParams& p) {
  if (p.m == 0 || p.n == 0) return;
  Allocator& alloc = dev.allocator();
  const int64_t a_rows = p.trans_a ? p.k : p.m, a_cols = p.trans_a ? p.m : p.k;
  const int64_t b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;

  Buffer a_buf, b_buf, c_buf;
  const float* a = static_cast<const float*>(p.a);
  const float* b = static_cast<const float*>(p.b);
  float* c = static_cast<float*>(p.c);
  int64_t lda = p.lda, ldb = p.ldb, ldc = p.ldc;
  if (p.a_dtype != DType::kF32) {
    a_buf = alloc.allocate(a_rows * a_cols * 4, p.scratch_tag, "gemm A in fp32");
    a = a_buf.as<float>();
    lda = a_cols;
  }
  if (p.b_dtype != DType::kF32) {
    b_buf = alloc.allocate(b_rows * b_cols * 4, p.scratch_tag, "gemm B in fp32");
    b = b_buf.as<float>();
    ldb = b_cols;
  }
  if (p.c_dtype != DType::kF32) {
    c_buf = alloc.allocate(p.m * p.n * 4, p.scratch_tag, "gemm C in fp32");
    c = c_buf.as<float>();
    ldc = p.n;
  }
  if (!dev.backed()) return;  // rehearsal: scratch counted, nothing computed

  if (p.a_dtype != DType::kF32) widen(a_buf.as<float>(), p.a, p.a_dtype, a_rows, a_cols, p.lda);
  if (p.b_dtype != DType::kF32) widen(b_buf.as<float>(), p.b, p.b_dtype, b_rows, b_cols, p.ldb);
  if (p.c_dtype != DType::kF32 && p.beta != 0.0f)
    widen(c_buf.as<float>(), p.c, p.c_dtype, p.m, p.n, p.ldc);

  if (p.k == 0) {
    // BLAS may skip C when k = 0; define it: C = beta * C (beta 0 clears, NaN included).
    for (int64_t r = 0; r < p.m; ++r)
      for (int64_t j = 0; j < p.n; ++j) c[r * ldc + j] = p.beta == 0.0f ? 0.0f : p.beta * c[r * ldc + j];
  } else {
    sgemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a, lda, b, ldb, p.beta, c, ldc);
  }
  if (p.c_dtype != DType::kF32) {
    const int64_t es = dtype_size(p.c_dtype);
    for (int64_t r = 0; r < p.m; ++r)
      store_f32(static_cast<char*>(p.c) + r * p.ldc * es, p.c_dtype, c + r * p.n, p.n);
  }
}

}  // namespace untied::cpu

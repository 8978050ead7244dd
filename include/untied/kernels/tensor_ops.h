// Small tensor ops the strategies need between their GEMMs and exchanges, so that the same code
// runs on every backend (no host loops over device memory):
//
//   row_dot:  out[r * out_stride] = sum_d a[r * lda + d] * b[r * ldb + d]    (r < rows, d < dim)
//             fp32 accumulation; a and b in `dtype` (f32 or bf16); out fp32. Attention's
//             D_i = rowsum(dO * O) over a packed layout.
//   add_into: acc[i] = acc[i] + x[i]   (i < n): added in fp32, rounded to acc's dtype (round to
//             nearest even for bf16, as store_f32 does); acc and x each f32 or bf16.
//   convert:  dst[i] = src[i]  (i < n) between f32 and bf16 (either way, or the same type);
//             bf16 results are rounded to nearest even, as store_f32 does.
//   add_bias: out[r * ld + c] = out[r * ld + c] + bias[c]   (r < rows, c < n): a projection's
//             bias (Qwen2's q/k/v) added in fp32, rounded to out's dtype; out and bias f32 or bf16.
//   bias_grad: db[c] = (accumulate ? db[c] : 0) + sum_r g[r * ld + c]   (c < n): the bias's
//             gradient in fp32: the rows summed in order within chunks of kBiasGradRows, each from
//             0, and the chunks' sums added to db's in order (on every backend, and whatever the
//             thread count), rounded once to db's dtype; g and db f32 or bf16.
//
// All pointers are this device's memory. Elements are independent (no reduction across
// elements), so results do not depend on the thread count. In rehearsal (!dev.backed()) nothing
// is read or written. Workspace: none.
// REQUIRES: rows, dim, n >= 0; lda, ldb >= dim; ld >= n; out_stride >= 1; outputs do not overlap inputs.
#pragma once

#include <cstdint>

#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

void row_dot(Device& dev, int64_t rows, int64_t dim, DType dtype, const void* a, int64_t lda, const void* b,
             int64_t ldb, float* out, int64_t out_stride);

void add_into(Device& dev, void* acc, DType acc_dtype, const void* x, DType x_dtype, int64_t n);

void convert(Device& dev, void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n);

void add_bias(Device& dev, void* out, DType out_dtype, int64_t ld, int64_t rows, int64_t n, const void* bias,
              DType bias_dtype);

void bias_grad(Device& dev, void* db, DType db_dtype, const void* g, DType g_dtype, int64_t ld, int64_t rows,
               int64_t n, bool accumulate);
inline constexpr int64_t kBiasGradRows = 1024;

}  // namespace untied

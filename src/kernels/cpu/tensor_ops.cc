// The tensor ops (include/untied/kernels/tensor_ops.h) on the CPU: OpenMP over rows or fixed
// blocks of elements, the dtype helpers of core/dtype.h inside.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::cpu {

namespace {
constexpr int64_t kBlock = 4096;  // elements per task of the element-wise ops
}  // namespace

void row_dot(Device& dev, const RowDotCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& rows = c.rows;
  const auto& dim = c.dim;
  const auto& t = c.dtype;
  const auto& a = c.a;
  const auto& lda = c.lda;
  const auto& b = c.b;
  const auto& ldb = c.ldb;
  const auto& out = c.out;
  const auto& out_stride = c.out_stride;
  const int64_t es = dtype_size(t);
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t r = 0; r < rows; ++r)
    out[r * out_stride] = dot_f32(static_cast<const char*>(a) + r * lda * es, static_cast<const char*>(b) + r * ldb * es,
                                  t, dim);
}

void add_into(Device& dev, const AddIntoCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& acc = c.acc;
  const auto& acc_t = c.acc_dtype;
  const auto& x = c.x;
  const auto& x_t = c.x_dtype;
  const auto& n = c.n;
  const int64_t as = dtype_size(acc_t), xs = dtype_size(x_t);
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    char* a = static_cast<char*>(acc) + i * as;
    if (acc_t == DType::kF32) {
      accumulate_f32(reinterpret_cast<float*>(a), static_cast<const char*>(x) + i * xs, x_t, m);
      continue;
    }
    float sum[kBlock], add[kBlock];
    load_f32(sum, a, acc_t, m);
    load_f32(add, static_cast<const char*>(x) + i * xs, x_t, m);
    for (int64_t k = 0; k < m; ++k) sum[k] += add[k];
    store_f32(a, acc_t, sum, m);
  }
}

void convert(Device& dev, const ConvertCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& dst = c.dst;
  const auto& dst_t = c.dst_dtype;
  const auto& src = c.src;
  const auto& src_t = c.src_dtype;
  const auto& n = c.n;
  const int64_t ds = dtype_size(dst_t), ss = dtype_size(src_t);
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t i = 0; i < n; i += kBlock) {
    float tmp[kBlock];
    const int64_t m = std::min(kBlock, n - i);
    load_f32(tmp, static_cast<const char*>(src) + i * ss, src_t, m);
    store_f32(static_cast<char*>(dst) + i * ds, dst_t, tmp, m);
  }
}

void add_bias(Device& dev, const AddBiasCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& out = c.out;
  const auto& out_t = c.out_dtype;
  const auto& ld = c.ld;
  const auto& rows = c.rows;
  const auto& n = c.n;
  std::vector<float> bias(static_cast<size_t>(n));
  load_f32(bias.data(), c.bias, c.bias_dtype, n);
  const float* b = bias.data();
  const int64_t os = dtype_size(out_t);
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t r = 0; r < rows; ++r) {
    char* row = static_cast<char*>(out) + r * ld * os;
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      float sum[kBlock];
      load_f32(sum, row + i * os, out_t, m);
      for (int64_t k = 0; k < m; ++k) sum[k] += b[i + k];
      store_f32(row + i * os, out_t, sum, m);
    }
  }
}

void bias_grad(Device& dev, const BiasGradCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& g = c.g;
  const auto& g_t = c.g_dtype;
  const auto& ld = c.ld;
  const auto& rows = c.rows;
  const auto& n = c.n;
  const int64_t gs = dtype_size(g_t);
  std::vector<float> sums(static_cast<size_t>(n), 0.0f);
  if (c.accumulate) load_f32(sums.data(), c.db, c.db_dtype, n);
  float* acc = sums.data();
  // Columns split in blocks over the threads; each block adds the rows in order within chunks of
  // kBiasGradRows, each chunk's sum from 0, and the chunks' sums to db's in order (the GPU's order).
  constexpr int64_t kCols = 256;
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t c0 = 0; c0 < n; c0 += kCols) {
    const int64_t m = std::min(kCols, n - c0);
    float chunk[kCols];
    for (int64_t r0 = 0; r0 < rows; r0 += kBiasGradRows) {
      std::fill(chunk, chunk + m, 0.0f);
      for (int64_t r = r0; r < std::min(rows, r0 + kBiasGradRows); ++r)
        accumulate_f32(chunk, static_cast<const char*>(g) + (r * ld + c0) * gs, g_t, m);
      for (int64_t k = 0; k < m; ++k) acc[c0 + k] += chunk[k];
    }
  }
  store_f32(c.db, c.db_dtype, acc, n);
}

}  // namespace untied::cpu

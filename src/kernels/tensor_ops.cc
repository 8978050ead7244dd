#include "untied/kernels/tensor_ops.h"

#include "kernels/backend.h"

namespace untied {

namespace {
void check_float(DType t, const char* op, const char* what) {
  UNTIED_CHECK(t == DType::kF32 || t == DType::kBF16, op, ": ", what, " must be f32 or bf16, got ", dtype_name(t));
}
}  // namespace

void row_dot(Device& dev, int64_t rows, int64_t dim, DType t, const void* a, int64_t lda, const void* b, int64_t ldb,
             float* out, int64_t out_stride) {
  UNTIED_CHECK(rows >= 0 && dim >= 0, "row_dot: rows and dim must be >= 0, got ", rows, ", ", dim);
  UNTIED_CHECK(lda >= dim && ldb >= dim && out_stride >= 1, "row_dot: strides too short: lda=", lda, " ldb=", ldb,
               " (need >= dim = ", dim, "), out_stride=", out_stride);
  check_float(t, "row_dot", "dtype");
  if (rows == 0) return;
  run_op(dev, &KernelTable::row_dot, "row_dot",
         RowDotCall{.rows = rows, .dim = dim, .dtype = t, .a = a, .lda = lda, .b = b, .ldb = ldb, .out = out,
                    .out_stride = out_stride});
}

void add_into(Device& dev, void* acc, DType acc_t, const void* x, DType x_t, int64_t n) {
  UNTIED_CHECK(n >= 0, "add_into: n must be >= 0, got ", n);
  check_float(acc_t, "add_into", "acc");
  check_float(x_t, "add_into", "x");
  if (n == 0) return;
  run_op(dev, &KernelTable::add_into, "add_into",
         AddIntoCall{.acc = acc, .acc_dtype = acc_t, .x = x, .x_dtype = x_t, .n = n});
}

void convert(Device& dev, void* dst, DType dst_t, const void* src, DType src_t, int64_t n) {
  UNTIED_CHECK(n >= 0, "convert: n must be >= 0, got ", n);
  check_float(dst_t, "convert", "dst");
  check_float(src_t, "convert", "src");
  if (n == 0) return;
  run_op(dev, &KernelTable::convert, "convert",
         ConvertCall{.dst = dst, .dst_dtype = dst_t, .src = src, .src_dtype = src_t, .n = n});
}

void add_bias(Device& dev, void* out, DType out_t, int64_t ld, int64_t rows, int64_t n, const void* bias,
              DType bias_t) {
  UNTIED_CHECK(rows >= 0 && n >= 0 && ld >= n, "add_bias: need rows, n >= 0 and ld >= n, got rows=", rows,
               " n=", n, " ld=", ld);
  check_float(out_t, "add_bias", "out");
  check_float(bias_t, "add_bias", "bias");
  if (rows == 0 || n == 0) return;
  run_op(dev, &KernelTable::add_bias, "add_bias",
         AddBiasCall{.out = out, .out_dtype = out_t, .ld = ld, .rows = rows, .n = n, .bias = bias,
                     .bias_dtype = bias_t});
}

void bias_grad(Device& dev, void* db, DType db_t, const void* g, DType g_t, int64_t ld, int64_t rows, int64_t n,
               bool accumulate) {
  UNTIED_CHECK(rows >= 0 && n >= 0 && ld >= n, "bias_grad: need rows, n >= 0 and ld >= n, got rows=", rows,
               " n=", n, " ld=", ld);
  check_float(db_t, "bias_grad", "db");
  check_float(g_t, "bias_grad", "g");
  if (n == 0) return;
  run_op(dev, &KernelTable::bias_grad, "bias_grad",
         BiasGradCall{.db = db, .db_dtype = db_t, .g = g, .g_dtype = g_t, .ld = ld, .rows = rows, .n = n,
                      .accumulate = accumulate});
}

}  // namespace untied

#include "untied/kernels/gemm.h"

#include "kernels/backend.h"

namespace untied {

void gemm(Device& dev, const GemmParams& p) {
  UNTIED_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0, "gemm: sizes must be >= 0, got m=", p.m, " n=", p.n,
               " k=", p.k);
  const int64_t a_cols = p.trans_a ? p.m : p.k, b_cols = p.trans_b ? p.k : p.n;
  UNTIED_CHECK(p.lda >= a_cols && p.ldb >= b_cols && p.ldc >= p.n, "gemm: leading dimensions too short: lda=",
               p.lda, " (needs >= ", a_cols, "), ldb=", p.ldb, " (needs >= ", b_cols, "), ldc=", p.ldc,
               " (needs >= ", p.n, ")");
  for (DType t : {p.a_dtype, p.b_dtype, p.c_dtype})
    UNTIED_CHECK(t == DType::kF32 || t == DType::kBF16, "gemm: operands must be f32 or bf16, got ",
                 dtype_name(t));
  run_op(dev, &KernelTable::gemm, "gemm", p);
}

}  // namespace untied

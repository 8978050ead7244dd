#include "untied/kernels/gemm.h"

#include "kernels/backend.h"

namespace untied {

namespace {
void check_gemm(const GemmParams& p) {
  UNTIED_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0, "gemm: sizes must be >= 0, got m=", p.m, " n=", p.n,
               " k=", p.k);
  const int64_t a_cols = p.trans_a ? p.m : p.k, b_cols = p.trans_b ? p.k : p.n;
  UNTIED_CHECK(p.lda >= a_cols && p.ldb >= b_cols && p.ldc >= p.n, "gemm: leading dimensions too short: lda=",
               p.lda, " (needs >= ", a_cols, "), ldb=", p.ldb, " (needs >= ", b_cols, "), ldc=", p.ldc,
               " (needs >= ", p.n, ")");
  for (DType t : {p.a_dtype, p.b_dtype, p.c_dtype})
    UNTIED_CHECK(t == DType::kF32 || t == DType::kBF16, "gemm: operands must be f32 or bf16, got ",
                 dtype_name(t));
}
}  // namespace

void gemm(Device& dev, const GemmParams& p) {
  check_gemm(p);
  if (p.b_group_offsets != nullptr) {
    UNTIED_CHECK(!p.trans_a && p.b_group > 0 && p.b_group % 32 == 0 && p.n % p.b_group == 0,
                 "gemm: b_group_offsets (op(B) gathered) needs trans_a false and b_group a positive multiple of 32 "
                 "dividing n, got trans_a=", p.trans_a, " b_group=", p.b_group, " n=", p.n);
    if (dev.kernels() != nullptr) {  // a backend with its own kernels (CUDA): gathered into a copy here
      const int64_t es = dtype_size(p.b_dtype), g = p.b_group, groups = p.n / g;
      Buffer copy = dev.allocator().allocate(p.n * p.k * es, p.scratch_tag, "gemm B gathered (copy)");
      char* dst = static_cast<char*>(copy.data());
      const char* src = static_cast<const char*>(p.b);
      for (int64_t i = 0; i < groups; ++i) {
        if (p.trans_b)  // B (n, k): the group's g rows
          dev.copy_2d(dst + i * g * p.k * es, p.k * es, src + p.b_group_offsets[i] * es, p.ldb * es, p.k * es, g);
        else  // B (k, n): the group's g columns, in every row
          dev.copy_2d(dst + i * g * es, p.n * es, src + p.b_group_offsets[i] * es, p.ldb * es, g * es, p.k);
      }
      GemmParams q = p;
      q.b = copy.data();
      q.ldb = p.trans_b ? p.k : p.n;
      q.b_group_offsets = nullptr;
      q.b_group = 0;
      run_op(dev, &KernelTable::gemm, "gemm", q);
      return;
    }
  }
  run_op(dev, &KernelTable::gemm, "gemm", p);
}

void gemm_grouped(Device& dev, const std::vector<GemmParams>& groups) {
  std::vector<GemmParams> work;  // the groups with a product to make
  for (const GemmParams& p : groups) {
    check_gemm(p);
    if (p.m > 0 && p.n > 0) work.push_back(p);
  }
  const OpEntry<GemmGroupedCall>& e = kernel_table(dev).gemm_grouped;
  bool one_call = e.run != nullptr && work.size() > 1;
  for (const GemmParams& p : work)
    one_call = one_call && p.b_group_offsets == nullptr && p.a_dtype == work[0].a_dtype &&
               p.b_dtype == work[0].b_dtype && p.c_dtype == work[0].c_dtype;
  const GemmGroupedCall call{.groups = work.data(), .count = static_cast<int64_t>(work.size())};
  if (one_call && e.supports != nullptr) one_call = e.supports(call).ok();
  if (!one_call) {
    for (const GemmParams& p : work) gemm(dev, p);
    return;
  }
  run_op(dev, &KernelTable::gemm_grouped, "gemm_grouped", call);
}

}  // namespace untied

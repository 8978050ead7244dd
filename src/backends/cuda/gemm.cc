// GEMM on the GPU through cuBLAS (cublasGemmEx, fp32 accumulation): f32 x f32 -> f32, or
// bf16 x bf16 -> bf16 / f32. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
// so cuBLAS is called with the operands swapped. Grouped (gemm_grouped): one
// cublasGemmGroupedBatchedEx, one problem per group, for the types it takes (A, B and C all f32
// or all bf16); the groups one by one otherwise, or where the library lacks the call.
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_kernels.h"

namespace untied::cuda {
namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

}  // namespace

Status gemm_supports(const GemmParams& p) {
  if (p.a_dtype != p.b_dtype)
    return Status::unsupported(str_cat("A ", dtype_name(p.a_dtype), " and B ", dtype_name(p.b_dtype),
                                       ": give both the same dtype"));
  if (p.a_dtype != DType::kBF16 && p.c_dtype != DType::kF32)
    return Status::unsupported(str_cat("f32 inputs and ", dtype_name(p.c_dtype), " output"));
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX || p.lda > INT32_MAX || p.ldb > INT32_MAX ||
      p.ldc > INT32_MAX)
    return Status::unsupported(str_cat("a dimension over 2^31-1 (m=", p.m, " n=", p.n, " k=", p.k, ")"));
  return Status::ok_status();
}

void gemm(Device& dev, const GemmParams& p, const Scratch&) {
  if (p.m == 0 || p.n == 0) return;
  auto& cd = static_cast<CudaDevice&>(dev);
  const float alpha = p.alpha, beta = p.beta;
  UNTIED_CUBLAS_CHECK(cublasGemmEx(cd.cublas(), p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k), &alpha, p.b,
                                   cuda_type(p.b_dtype), static_cast<int>(p.ldb), p.a, cuda_type(p.a_dtype),
                                   static_cast<int>(p.lda), &beta, p.c, cuda_type(p.c_dtype), static_cast<int>(p.ldc),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

Status gemm_grouped_supports(const GemmGroupedCall& c) {
  for (int64_t g = 0; g < c.count; ++g) {
    const GemmParams& p = c.groups[g];
    if (p.a_dtype != p.c_dtype)  // (cublasGemmGroupedBatchedEx: A, B and C of one type)
      return Status::unsupported(str_cat("grouped: A ", dtype_name(p.a_dtype), " and C ", dtype_name(p.c_dtype)));
    // Pointer-array GEMMs want 16-byte aligned matrices and rows: the rest go one by one.
    const int64_t per16 = 16 / dtype_size(p.a_dtype);
    for (const void* ptr : {p.a, static_cast<const void*>(p.b), static_cast<const void*>(p.c)})
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return Status::unsupported("grouped: a matrix not 16-byte aligned");
    if (p.lda % per16 != 0 || p.ldb % per16 != 0 || p.ldc % per16 != 0)
      return Status::unsupported("grouped: a leading dimension not a multiple of 16 bytes");
    if (Status s = gemm_supports(p); !s.ok()) return s;
  }
  if (c.count > INT32_MAX) return Status::unsupported("grouped: more than 2^31-1 groups");
  return Status::ok_status();
}

enum GemmGroupedScratch { kGroupedPointers };

ScratchRequest gemm_grouped_scratch(const Device&, const GemmGroupedCall& c) {
  ScratchRequest r;
  r.set(kGroupedPointers, 3 * c.count * static_cast<int64_t>(sizeof(void*)), Tag::kOther,
        "gemm_grouped pointers");
  return r;
}

void gemm_grouped(Device& dev, const GemmGroupedCall& c, const Scratch& scratch) {
  auto& cd = static_cast<CudaDevice&>(dev);
  const size_t n = static_cast<size_t>(c.count);
  std::vector<cublasOperation_t> ta(n), tb(n);
  std::vector<int> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), size(n, 1);
  std::vector<float> alpha(n), beta(n);
  std::vector<const void*> ptrs(3 * n);  // A of every group, then B, then C (cuBLAS's order, swapped)
  for (size_t g = 0; g < n; ++g) {
    const GemmParams& p = c.groups[g];
    ta[g] = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb[g] = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[g] = static_cast<int>(p.n), nn[g] = static_cast<int>(p.m), k[g] = static_cast<int>(p.k);
    lda[g] = static_cast<int>(p.ldb), ldb[g] = static_cast<int>(p.lda), ldc[g] = static_cast<int>(p.ldc);
    alpha[g] = p.alpha, beta[g] = p.beta;
    ptrs[g] = p.b, ptrs[n + g] = p.a, ptrs[2 * n + g] = p.c;
  }
  void** dev_ptrs = scratch.as<void*>(kGroupedPointers);
  // (from pageable memory: the copy has taken the bytes when the call returns)
  UNTIED_CUDA_CHECK(cudaMemcpyAsync(dev_ptrs, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice,
                                    cd.stream()));
  const GemmParams& p0 = c.groups[0];
  const cublasStatus_t st = cublasGemmGroupedBatchedEx(
      cd.cublas(), ta.data(), tb.data(), m.data(), nn.data(), k.data(), alpha.data(), dev_ptrs,
      cuda_type(p0.b_dtype), lda.data(), dev_ptrs + n, cuda_type(p0.a_dtype), ldb.data(), beta.data(),
      dev_ptrs + 2 * n, cuda_type(p0.c_dtype), ldc.data(), static_cast<int>(n), size.data(), CUBLAS_COMPUTE_32F);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // a cuBLAS without the call (before 12.5), or these types
    for (size_t g = 0; g < n; ++g) gemm(dev, c.groups[g], Scratch{});
    return;
  }
  UNTIED_CUBLAS_CHECK(st);
}

}  // namespace untied::cuda

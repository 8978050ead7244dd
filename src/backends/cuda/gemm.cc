// GEMM on the GPU through cuBLAS (cublasGemmEx, fp32 accumulation): f32 x f32 -> f32, or
// bf16 x bf16 -> bf16 / f32. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
// so cuBLAS is called with the operands swapped.
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

}  // namespace untied::cuda

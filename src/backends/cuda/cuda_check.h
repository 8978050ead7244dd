// UNTIED_CUDA_CHECK(stmt) and UNTIED_CUBLAS_CHECK(stmt): run a CUDA runtime / cuBLAS call and on
// failure throw untied::Error naming the statement, the error and the rank:
//   rank 2: src/backends/cuda/gemm.cc:40: cublasGemmEx(...) -> CUBLAS_STATUS_INVALID_VALUE
// CUDA headers are included only under */cuda/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "untied/core/check.h"

#define UNTIED_CUDA_CHECK(stmt)                                                                  \
  do {                                                                                          \
    const cudaError_t untied_err_ = (stmt);                                                     \
    if (untied_err_ != cudaSuccess) [[unlikely]]                                                \
      ::untied::fail(::untied::ErrorKind::kInternal, ::untied::error_prefix(__FILE__, __LINE__) + \
                                                         #stmt " -> " + cudaGetErrorString(untied_err_)); \
  } while (0)

#define UNTIED_CUBLAS_CHECK(stmt)                                                                \
  do {                                                                                          \
    const cublasStatus_t untied_st_ = (stmt);                                                   \
    if (untied_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                       \
      ::untied::fail(::untied::ErrorKind::kInternal, ::untied::error_prefix(__FILE__, __LINE__) + \
                                                         #stmt " -> " + cublasGetStatusString(untied_st_)); \
  } while (0)

// The cuBLAS calls of the CUDA backend (src/backends/cuda/gemm.cc, src/backends/cuda/), answered on
// the host for the emulator, so that the backend's own GEMM code runs there: its row-major to
// column-major mapping is checked against cuBLAS's documented column-major semantics,
//   C (m x n, ldc) = alpha op(A) op(B) + beta C,
//   op(A) m x k: A is m x k (lda >= m) for CUBLAS_OP_N, k x m (lda >= k) for CUBLAS_OP_T; B alike,
// with cuBLAS's own argument checks (CUBLAS_STATUS_INVALID_VALUE for a short leading dimension or
// a negative size; CUBLAS_STATUS_NOT_SUPPORTED for type combinations cublasGemmEx lacks among
// those untied uses: 32F x 32F -> 32F, 16BF x 16BF -> 16BF or 32F, CUBLAS_COMPUTE_32F).
// The product is OpenBLAS's sgemm on fp32 copies of the operands; a bf16 C is rounded to nearest
// even. Operands are device memory, so the call is a device operation (emu_device_memory.h).
// Links in place of libcublas.
#include <cblas.h>
#include <cublas_v2.h>

#include <algorithm>
#include <vector>

#include "emu_device_memory.h"
#include "untied/core/dtype.h"

namespace {

int g_handle;  // what every handle points at

bool type_of(cudaDataType t, untied::DType* out) {
  if (t == CUDA_R_32F) *out = untied::DType::kF32;
  else if (t == CUDA_R_16BF) *out = untied::DType::kBF16;
  else return false;
  return true;
}

// The rows x cols column-major matrix at p (leading dimension ld, type t) as fp32, same layout.
std::vector<float> widen(const void* p, untied::DType t, int rows, int cols, int ld) {
  std::vector<float> out(static_cast<size_t>(ld) * cols);
  const size_t es = untied::dtype_size(t);
  for (int j = 0; j < cols; ++j)
    untied::load_f32(out.data() + static_cast<size_t>(j) * ld, static_cast<const char*>(p) + es * j * ld, t, rows);
  return out;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = reinterpret_cast<cublasHandle_t>(&g_handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS (emulated)";
  }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t) {
  using untied::DType;
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  DType at, bt, ct;
  if (!type_of(Atype, &at) || !type_of(Btype, &bt) || !type_of(Ctype, &ct) || at != bt ||
      (at == DType::kF32 && ct != DType::kF32) || computeType != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if ((transa != CUBLAS_OP_N && !ta) || (transb != CUBLAS_OP_N && !tb)) return CUBLAS_STATUS_INVALID_VALUE;
  const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  emu::DeviceScope scope;  // A, B and C are device memory
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const std::vector<float> a = widen(A, at, a_rows, a_cols, lda), b = widen(B, bt, b_rows, b_cols, ldb);
  std::vector<float> c = be != 0.0f ? widen(C, ct, m, n, ldc) : std::vector<float>(static_cast<size_t>(ldc) * n);
  if (k > 0)
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, al, a.data(),
                lda, b.data(), ldb, be, c.data(), ldc);
  else
    for (float& x : c) x *= be;
  const size_t es = untied::dtype_size(ct);
  for (int j = 0; j < n; ++j)
    untied::store_f32(static_cast<char*>(C) + es * j * ldc, ct, c.data() + static_cast<size_t>(j) * ldc, m);
  return CUBLAS_STATUS_SUCCESS;
}

// Every problem of every group through cublasGemmEx above (pointer mode host: alpha and beta per
// group on the host; the pointer arrays in device memory).
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t handle, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void* alpha_array,
                                          const void* const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void* beta_array, void* const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t computeType) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (group_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
  untied::DType at, ct;
  // cuBLAS's grouped call takes A, B and C of one type.
  if (!type_of(Atype, &at) || !type_of(Ctype, &ct) || Atype != Btype || at != ct) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::vector<const void*> a, b;
  std::vector<void*> c;
  int problems = 0;
  for (int g = 0; g < group_count; ++g) problems += group_size[g];
  {
    emu::DeviceScope scope;  // the pointer arrays are device memory
    a.assign(Aarray, Aarray + problems), b.assign(Barray, Barray + problems), c.assign(Carray, Carray + problems);
  }
  for (int g = 0, at_problem = 0; g < group_count; ++g)
    for (int i = 0; i < group_size[g]; ++i, ++at_problem) {
      const cublasStatus_t s = cublasGemmEx(handle, transa_array[g], transb_array[g], m_array[g], n_array[g],
                                            k_array[g], static_cast<const float*>(alpha_array) + g, a[at_problem],
                                            Atype, lda_array[g], b[at_problem], Btype, ldb_array[g],
                                            static_cast<const float*>(beta_array) + g, c[at_problem], Ctype,
                                            ldc_array[g], computeType, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

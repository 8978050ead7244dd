// The cuBLAS functions the CUDA backend calls (cuda_device.cc, kernels/cuda/gemm.cc), resolved
// from libcublas at their first call instead of linked: libcublas and the libcublasLt it loads
// take about 210 MiB of resident memory as soon as they are loaded, which every process of a CUDA
// build paid before, a CPU run included. Each function below has cuBLAS's own signature and
// forwards to the library's; the library is opened once (dlopen, by its soname: the directories
// of LD_LIBRARY_PATH and the executable's run path, then the CUDA toolkit's library directory of
// the build). If it cannot be opened, the call throws an Error that says so.
// The emulated backend (emu/) links its own answers to these functions instead of this file.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "untied/core/check.h"

namespace {

void* library() {
  static void* handle = nullptr;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#if defined(UNTIED_CUDA_LIBRARY_DIR)
    if (handle == nullptr)
      handle = dlopen((std::string(UNTIED_CUDA_LIBRARY_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
    if (handle == nullptr) {
      const char* why = dlerror();
      error = soname + " could not be loaded (" + (why != nullptr ? why : "no reason given") +
              "): install cuBLAS of CUDA " + std::to_string(CUBLAS_VER_MAJOR) +
              " or add its directory to LD_LIBRARY_PATH";
    }
  });
  UNTIED_CHECK(handle != nullptr, error);
  return handle;
}

// The library's function `name`, of the type of our own definition `self`.
template <typename Fn>
Fn resolve(Fn /*self*/, const char* name) {
  void* f = dlsym(library(), name);
  UNTIED_CHECK(f != nullptr, "cuBLAS has no ", name, " (", dlerror(), ")");
  return reinterpret_cast<Fn>(f);
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  static const auto f = resolve(&cublasCreate_v2, "cublasCreate_v2");
  return f(handle);
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  static const auto f = resolve(&cublasDestroy_v2, "cublasDestroy_v2");
  return f(handle);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  static const auto f = resolve(&cublasSetStream_v2, "cublasSetStream_v2");
  return f(handle, stream);
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  static const auto f = resolve(&cublasGetStatusString, "cublasGetStatusString");
  return f(status);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                                         cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  static const auto f = resolve(GemmEx{}, "cublasGemmEx");
  return f(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType,
           algo);
}

// Optional (cuBLAS 12.5 on): without it the call answers CUBLAS_STATUS_NOT_SUPPORTED, and the
// backend runs the groups one by one.
cublasStatus_t CUBLASWINAPI cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[], const cublasOperation_t transb_array[],
    const int m_array[], const int n_array[], const int k_array[], const void* alpha_array, const void* const Aarray[],
    cudaDataType_t Atype, const int lda_array[], const void* const Barray[], cudaDataType_t Btype,
    const int ldb_array[], const void* beta_array, void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
  using Grouped = cublasStatus_t (*)(cublasHandle_t, const cublasOperation_t[], const cublasOperation_t[], const int[],
                                     const int[], const int[], const void*, const void* const[], cudaDataType_t,
                                     const int[], const void* const[], cudaDataType_t, const int[], const void*,
                                     void* const[], cudaDataType_t, const int[], int, const int[],
                                     cublasComputeType_t);
  static const auto f = reinterpret_cast<Grouped>(dlsym(library(), "cublasGemmGroupedBatchedEx"));
  if (f == nullptr) return CUBLAS_STATUS_NOT_SUPPORTED;
  return f(handle, transa_array, transb_array, m_array, n_array, k_array, alpha_array, Aarray, Atype, lda_array,
           Barray, Btype, ldb_array, beta_array, Carray, Ctype, ldc_array, group_count, group_size, computeType);
}

}  // extern "C"

// The CUDA Device's concrete type, for the CUDA kernels (its stream and cuBLAS handle).
#pragma once

#include <memory>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "untied/device/device.h"

namespace untied {

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, int64_t budget, std::string gpu_name);
  ~CudaDevice() override;
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  const KernelTable* kernels() const override;
  std::string name() const override;
  Allocator& allocator() override { return alloc_; }
  void copy(void* dst, const void* src, int64_t bytes) override;
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows) override;
  void fill_zero(void* dst, int64_t bytes) override;
  void synchronize() override;
  std::unique_ptr<MemorySource> host_memory() override;  // page-locked, cached by size
  int threads() const override { return 1; }
  int index() const { return index_; }  // the GPU (cudaSetDevice index)
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

 private:
  int index_;
  std::string name_;
  Allocator alloc_;
  int64_t max_pitch_ = 0;  // the largest pitch cudaMemcpy2DAsync takes (cudaDevAttrMaxPitch)
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

}  // namespace untied

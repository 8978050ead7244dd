// The emulator's stand-in for src/device/cuda/cuda_device.h (found first on the include path of
// the emulated kernels): a CudaDevice whose "GPU memory" is host memory, one exact-size malloc
// per buffer (so AddressSanitizer sees every overrun) filled with 0xFF (a NaN pattern: an output
// element the kernel never writes shows as NaN), and no stream. Its copies and fills are device
// operations (emu::DeviceScope). The whole-engine tests use the backend's own CudaDevice instead.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "device/cuda/cuda_check.h"
#include "emu_device_memory.h"
#include "untied/device/device.h"

namespace untied {

class EmulatedGpuMemory final : public MemorySource {
 public:
  std::string_view name() const override { return "emulated gpu"; }
  void* allocate(int64_t bytes) override {
    void* p = std::malloc(static_cast<size_t>(bytes));
    if (p != nullptr) std::memset(p, 0xFF, static_cast<size_t>(bytes));
    return p;
  }
  void release(void* ptr, int64_t) noexcept override { std::free(ptr); }
  bool backed() const override { return true; }
};

class CudaDevice final : public Device {
 public:
  CudaDevice()
      : alloc_(std::make_unique<EmulatedGpuMemory>(), Allocator::Options{.budget_bytes = 0, .name = "emulated gpu"}) {}
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "emulated gpu"; }
  Allocator& allocator() override { return alloc_; }
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    emu::DeviceScope scope;
    std::memmove(dst, src, bytes);
  }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows) override {
    emu::DeviceScope scope;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
  }
  void fill_zero(void* dst, int64_t bytes) override {
    if (bytes <= 0) return;
    emu::DeviceScope scope;
    std::memset(dst, 0, bytes);
  }
  void synchronize() override {}
  int threads() const override { return 1; }
  cudaStream_t stream() const { return nullptr; }
  // Any non-null handle: emu_cublas.cc answers every handle alike.
  cublasHandle_t cublas() const { return reinterpret_cast<cublasHandle_t>(const_cast<CudaDevice*>(this)); }

 private:
  Allocator alloc_;
};

}  // namespace untied

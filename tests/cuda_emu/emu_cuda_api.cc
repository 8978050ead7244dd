// The few CUDA runtime calls the emulated kernels' launchers make, answered on the host for the
// emulator (emu_runtime.h): an sm_90-like device (132 SMs, 227 KiB of opt-in shared memory per
// block) whose compute capability the test can change, and memsets and copies on host memory
// (every kernel has finished when its launch returns, so the stream calls have nothing to wait
// for); each copy and memset is a device operation (emu_device_memory.h). Links in place of
// libcudart; no other runtime call exists in the test binary.
#include <cuda_runtime.h>

#include <cstring>

#include "emu_device_memory.h"

namespace emu {
namespace {
int g_cc_major = 9;
constexpr int kSmemOptin = 232448;
}  // namespace

void set_compute_capability(int major) { g_cc_major = major; }

}  // namespace emu

extern "C" {

// The kernels cache device capabilities per device index, so each emulated compute capability is
// presented as a device of its own.
cudaError_t cudaGetDevice(int* device) {
  *device = emu::g_cc_major;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = emu::g_cc_major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = emu::kSmemOptin; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    default: *value = 0;
  }
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int value) {
  return value <= emu::kSmemOptin ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  emu::DeviceScope scope;
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height, cudaStream_t) {
  if (width > pitch) return cudaErrorInvalidValue;
  emu::DeviceScope scope;
  for (size_t r = 0; r < height; ++r) std::memset(static_cast<char*>(p) + r * pitch, value, width);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  emu::DeviceScope scope;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "emulated CUDA error"; }

}  // extern "C"

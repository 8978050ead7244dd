// The CUDA runtime calls of the backend (its kernels' launchers, its CudaDevice and the NCCL
// communicator), answered on the host for the emulator (emu_runtime.h): sm_90-like GPUs (132 SMs,
// 227 KiB of opt-in shared memory per block, kEmulatedGpuBytes of memory shared by the process),
// as many as UNTIED_EMU_GPUS says (default 1), GPU i on PCI bus i, so that processes using the
// same index share "a GPU" as NCCL sees it; the op test (tests/ops) can present other compute
// capabilities (set_compute_capability). Its memory (cudaMalloc) is guarded
// device memory (emu_device_memory.h); page-locked host memory (cudaHostAlloc) is plain host
// memory. Memsets and copies run at once on the host (every kernel has finished when its launch
// returns, so streams have nothing to wait for), each a device operation, with the runtime's own
// argument checks where untied's code could get them wrong (cudaMemcpy2DAsync's pitches, memory
// beyond the GPU's). Links in place of libcudart; no other runtime call exists in the binaries.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "emu_device_memory.h"

namespace emu {
namespace {
constexpr int kDefaultCc = 9;
constexpr int kCcDevice = 1000;  // devices kCcDevice + major: set_compute_capability's
thread_local int g_current = 0;  // the calling thread's device, as in CUDA
constexpr int kSmemOptin = 232448;
constexpr size_t kEmulatedGpuBytes = size_t{4} << 30;
constexpr int kMaxPitch = 0x7fffffff;  // cudaDevAttrMaxPitch of an H100

std::mutex g_mem_mu;
struct Block {
  size_t bytes;
  int device;  // current when it was allocated
};
std::unordered_map<void*, Block> g_live;  // cudaMalloc'd blocks
size_t g_live_bytes = 0;
int g_stream_tag;  // what every stream points at
int g_event_tag;   // and every event

int gpu_count() {
  const char* e = std::getenv("UNTIED_EMU_GPUS");
  const int n = e != nullptr ? std::atoi(e) : 1;
  return n >= 1 ? n : 1;
}
int cc_of(int device) { return device >= kCcDevice ? device - kCcDevice : kDefaultCc; }

// The device of the cudaMalloc'd block holding p, or -1.
int device_of(const void* p) {
  std::lock_guard<std::mutex> lock(g_mem_mu);
  for (const auto& [q, b] : g_live)
    if (p >= q && static_cast<const char*>(p) < static_cast<const char*>(q) + b.bytes) return b.device;
  return -1;
}
}  // namespace

// The kernels cache device capabilities per device index, so each emulated compute capability is
// a device of its own: the calling thread moves to it.
void set_compute_capability(int major) { g_current = kCcDevice + major; }

}  // namespace emu

extern "C" {

cudaError_t cudaGetDevice(int* device) {
  *device = emu::g_current;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = emu::cc_of(device); break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = emu::kSmemOptin; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrMaxPitch: *value = emu::kMaxPitch; break;
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

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  if (dpitch > static_cast<size_t>(emu::kMaxPitch) || spitch > static_cast<size_t>(emu::kMaxPitch))
    return cudaErrorInvalidPitchValue;
  emu::DeviceScope scope;
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = reinterpret_cast<cudaStream_t>(&emu::g_stream_tag);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = reinterpret_cast<cudaEvent_t>(&emu::g_event_tag);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }

// Device memory for cudaMalloc'd blocks; host memory (registered or not) otherwise.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  *attr = cudaPointerAttributes{};
  const int device = emu::device_of(p);
  attr->type = device >= 0 ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
  attr->device = device >= 0 ? device : emu::g_current;
  attr->devicePointer = attr->type == cudaMemoryTypeDevice ? const_cast<void*>(p) : nullptr;
  attr->hostPointer = attr->type == cudaMemoryTypeDevice ? nullptr : const_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = emu::gpu_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if ((device < 0 || device >= emu::gpu_count()) && device < emu::kCcDevice) return cudaErrorInvalidDevice;
  emu::g_current = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (device < 0 || device >= emu::gpu_count()) return cudaErrorInvalidDevice;
  std::snprintf(bus_id, static_cast<size_t>(len), "0000:%02x:00.0", device);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= emu::gpu_count()) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "emulated GPU");
  prop->totalGlobalMem = emu::kEmulatedGpuBytes;
  prop->major = emu::cc_of(device);
  prop->multiProcessorCount = 132;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(emu::g_mem_mu);
  *total_bytes = emu::kEmulatedGpuBytes;
  *free_bytes = emu::kEmulatedGpuBytes - emu::g_live_bytes;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  std::lock_guard<std::mutex> lock(emu::g_mem_mu);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (bytes > emu::kEmulatedGpuBytes - emu::g_live_bytes) return cudaErrorMemoryAllocation;
  *p = emu::guarded_alloc(bytes);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  emu::g_live[*p] = emu::Block{bytes, emu::g_current};
  emu::g_live_bytes += bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(emu::g_mem_mu);
  auto it = emu::g_live.find(p);
  if (it == emu::g_live.end()) return cudaErrorInvalidValue;
  emu::guarded_free(p, it->second.bytes);
  emu::g_live_bytes -= it->second.bytes;
  emu::g_live.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument (emulated)";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (emulated)";
    default: return "emulated CUDA error";
  }
}

}  // extern "C"

// The CUDA device: one GPU per rank (or several in-process ranks sharing one GPU, each with its
// own Device, allocator and stream).
//
// Memory: the rank's tagged Allocator over a caching cudaMalloc source (freed blocks are kept
// for reuse by exact size and returned to the driver when the device is destroyed, or when a
// cudaMalloc fails: then every rank's cache on that GPU is emptied and it is tried once more;
// never managed memory). Work is ordered on the device's own stream; synchronize() waits for it. copy()
// handles host<->device and device<->device (cudaMemcpyDefault, on the stream, synchronous).
//
// make_cuda_device returns a Status the user can act on when there is no usable GPU, the index
// is out of range, or the budget asked exceeds the GPU's free memory. A build without CUDA
// answers that it was built without CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "untied/core/status.h"
#include "untied/device/device.h"

namespace untied {

struct CudaDeviceOptions {
  int index = 0;             // which GPU (cudaSetDevice)
  int64_t budget_bytes = 0;  // 0 = none; else must fit in the GPU's free memory
};

// True when this build includes the CUDA backend.
bool cuda_built();
// Number of GPUs visible (0 without CUDA or without a driver).
int cuda_device_count();

StatusOr<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions& opts);

// Free and total memory of GPU `index` now (cudaMemGetInfo), or why it cannot be read.
struct CudaMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
StatusOr<CudaMemoryInfo> cuda_memory_info(int index);

// Which attention kernels a CUDA run takes and why (UNTIED_CUDA_ATTENTION, whether cuDNN's can
// run here), one line for the banners; "" without the CUDA backend. With cudnn asked for, the first
// call opens libcudnn.
std::string cuda_attention_description();

}  // namespace untied

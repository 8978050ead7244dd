// The answers of a build without the CUDA backend (compiled only then; see CMakeLists.txt).
#include "untied/device/cuda.h"

namespace untied {

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_attention_description() { return ""; }

StatusOr<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions&) {
  return Status::unsupported(
      "this untied was built without CUDA: install the CUDA toolkit (nvcc) and rebuild, or use the CPU backend");
}

StatusOr<CudaMemoryInfo> cuda_memory_info(int) {
  return Status::unsupported(
      "this untied was built without CUDA: install the CUDA toolkit (nvcc) and rebuild, or use the CPU backend");
}

}  // namespace untied

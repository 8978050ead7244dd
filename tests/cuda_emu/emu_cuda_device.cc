// untied/device/cuda.h for the emulated build (in place of src/device/cuda/cuda_device.cc): one
// emulated GPU of kEmulatedGpuBytes, whose devices are the emulator's CudaDevice with guarded
// memory (host_device/, emu_device_memory.h). With it the real command line (untied_emu) runs its
// --device cuda paths on the CPU.
#include "device/cuda/cuda_device.h"  // the emulator's host_device/ version
#include "untied/device/cuda.h"

namespace untied {
namespace {
constexpr int64_t kEmulatedGpuBytes = int64_t{4} << 30;

Status check_index(int index) {
  if (index == 0) return Status::ok_status();
  return Status::invalid_argument("GPU index " + std::to_string(index) + " is out of range: 1 GPU(s) visible (emulated)");
}
}  // namespace

bool cuda_built() { return true; }
int cuda_device_count() { return 1; }

StatusOr<CudaMemoryInfo> cuda_memory_info(int index) {
  Status s = check_index(index);
  if (!s.ok()) return s;
  return CudaMemoryInfo{kEmulatedGpuBytes, kEmulatedGpuBytes};
}

StatusOr<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions& opts) {
  Status s = check_index(opts.index);
  if (!s.ok()) return s;
  if (opts.budget_bytes > kEmulatedGpuBytes)
    return Status::invalid_argument("--mem-budget " + format_bytes(opts.budget_bytes) + " exceeds the " +
                                    format_bytes(kEmulatedGpuBytes) + " of the emulated GPU: lower the budget");
  return std::unique_ptr<Device>(new CudaDevice(/*guarded=*/true, opts.budget_bytes));
}

}  // namespace untied

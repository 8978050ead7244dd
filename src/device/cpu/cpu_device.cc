#include <omp.h>

#include <cstring>

#include "untied/device/device.h"
#include "untied/core/check.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace untied {
namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& opts)
      : threads_(opts.threads),
        alloc_(opts.rehearsal ? make_counting_memory() : make_host_memory(),
               Allocator::Options{.budget_bytes = opts.budget_bytes,
                                  .name = opts.rehearsal ? "cpu-rehearsal" : "cpu",
                                  .track_buffers = opts.rehearsal}) {
    UNTIED_CHECK(opts.threads >= 1, "CPU threads must be >= 1, got ", opts.threads);
    omp_set_num_threads(threads_);
    openblas_set_num_threads(threads_);
  }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override {
    return "cpu (" + std::to_string(threads_) + (threads_ == 1 ? " thread)" : " threads)");
  }
  Allocator& allocator() override { return alloc_; }
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && alloc_.backed()) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows) override {
    if (row_bytes <= 0 || rows <= 0 || !alloc_.backed()) return;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
                  static_cast<size_t>(row_bytes));
  }
  void fill_zero(void* dst, int64_t bytes) override {
    if (bytes > 0 && alloc_.backed()) std::memset(dst, 0, static_cast<size_t>(bytes));
  }
  void synchronize() override {}
  int threads() const override { return threads_; }

 private:
  int threads_;
  Allocator alloc_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& opts) {
  return std::make_unique<CpuDevice>(opts);
}

void unsupported(const Device& dev, const char* op) {
  fail(ErrorKind::kUnsupported, error_prefix(__FILE__, __LINE__) + dev.name() +
                                    " does not support " + op);
}

}  // namespace untied

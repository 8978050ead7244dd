// Device: where a rank's buffers live and its kernels run.
//
// One Device per rank. It owns that rank's tagged Allocator (every buffer of the rank comes
// from it), copies and fills memory, and orders work (synchronize). Kernels take a Device&
// and dispatch through kernels(); a backend that lacks an op fails with
// "<backend> does not support <op>" (see unsupported()).
//
// CpuDevice: host memory, kernels on `threads` OpenMP/BLAS threads of the calling thread.
// Rehearsal (counting) devices report backed() == false: kernels must then skip compute.
//
// Thread safety: a Device is used by one rank (one thread, which may fan out to its own
// OpenMP team inside kernels).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "untied/core/allocator.h"

namespace untied {

enum class DeviceKind { kCpu, kCuda };

struct KernelTable;  // the kernels that run on a device (src/kernels/backend.h)

// Seconds spent in each kernel op (named as the kernels layer's dispatch names it: "gemm",
// "attention_forward", ...), each op's own time without the ops it calls (the loss calls gemm).
// Kept while Device::op_times is set, for devices whose kernels run on the calling thread (the
// CPU); a GPU's kernels are asynchronous and are not timed here.
struct OpTimes {
  std::map<std::string_view, double> seconds;  // op names are string literals
  std::vector<double> nested;                  // the running ops' callees' seconds, innermost last
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu (2 threads)"
  virtual Allocator& allocator() = 0;
  // Copies `bytes` between buffers of this device (host <-> host on the CPU).
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  // Strided copy between buffers of this device, or between one and host memory from
  // host_memory() (as copy()): `rows` rows of row_bytes, row r from
  // src + r * src_pitch to dst + r * dst_pitch (bytes). The pack/unpack of the all-to-all
  // layouts. Ordered with the device's other work (asynchronous on a GPU).
  virtual void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
                       int64_t rows) = 0;
  virtual void fill_zero(void* dst, int64_t bytes) = 0;
  // Waits for all work issued on this device (a no-op on the CPU).
  virtual void synchronize() = 0;
  // A source of host memory for buffers that copy() moves to and from this device (offloaded
  // activations): page-locked on a GPU, so that those copies run by DMA at the bus's full speed;
  // plain host memory on the CPU. Its memory is host memory: kernels never take it. Destroy the
  // source (its Allocator) before the device.
  virtual std::unique_ptr<MemorySource> host_memory() { return make_host_memory(); }
  // Threads a CPU kernel may use; 1 for devices that do not run kernels on host threads.
  virtual int threads() const = 0;
  // False in rehearsal: buffers are counted, not backed, and kernels skip their compute.
  bool backed() { return allocator().backed(); }
  // Set by a caller that wants each kernel op's time (OpTimes); null: none kept.
  OpTimes* op_times = nullptr;
  // The kernel table of this device's backend, for the kernels layer's dispatch; null: the host
  // (CPU) kernels. A backend that runs kernels elsewhere (CUDA) hands out its own.
  virtual const KernelTable* kernels() const { return nullptr; }
};

struct CpuDeviceOptions {
  int threads = 1;           // OpenMP and BLAS threads for this rank's kernels (>= 1)
  int64_t budget_bytes = 0;  // 0 = unlimited
  bool rehearsal = false;    // count allocations without backing them
};

// Sets the calling thread's OpenMP/BLAS thread count to opts.threads.
std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& opts);

// Throws Error(kUnsupported): "<device name> does not support <op>".
[[noreturn]] void unsupported(const Device& dev, const char* op);

}  // namespace untied

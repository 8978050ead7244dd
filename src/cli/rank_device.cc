#include "cli/rank_device.h"


#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "cli/launch.h"
#include "untied/kernels/cpu_kernels_info.h"
#include "untied/comm/nccl.h"
#include "untied/comm/watchdog.h"
#include "untied/core/random.h"
#include "untied/device/cuda.h"

namespace untied::cli {
namespace {

bool in_process(Communicator& world) { return world.backend() == "inproc"; }

// The GPU of this rank: GPU 0 for every in-process rank; the GPU of its local rank in a launched
// job (gpu_for_local_rank: the only one where the launcher gave each rank its own), or of its
// world rank where the launcher does not say the local one. Two ranks on one GPU are refused by
// make_nccl_communicator (it compares bus ids).
StatusOr<int> gpu_index(Communicator& world) {
  if (in_process(world) || cuda_device_count() == 0) return 0;  // (with none, make_cuda_device says why)
  const int local = local_rank_launched();
  return gpu_for_local_rank(local >= 0 ? local : world.rank(), cuda_device_count());
}

// make_cuda_device with any error of the CUDA runtime turned into a Status, so that every rank
// reaches the agreement that follows.
StatusOr<std::unique_ptr<Device>> make_gpu(int index, int64_t budget_bytes) {
  try {
    return make_cuda_device(CudaDeviceOptions{.index = index, .budget_bytes = budget_bytes});
  } catch (const Error& e) {
    return Status::unsupported(std::string("cannot use GPU ") + std::to_string(index) + ": " + e.what());
  }
}

// Free memory of GPU `index` now (cudaMemGetInfo through cuda_memory_info; the calling thread's
// current device is left as it was).
StatusOr<int64_t> gpu_free_bytes(int index) {
  auto info = cuda_memory_info(index);
  if (!info.ok()) return info.status();
  return info.value().free_bytes;
}

// Under mpirun: NCCL needs one GPU per rank on each host.
Status check_gpus_per_host() {
  const int gpus = cuda_device_count(), ranks = local_ranks_launched();
  if (!cuda_built() || gpus == 0 || ranks <= gpus) return Status::ok_status();  // make_cuda_device says why not
  if (gpus == 1) return Status::ok_status();  // one GPU per rank by binding, or NCCL's bus-id check refuses
  return Status::invalid_argument(std::to_string(ranks) + " ranks on this host share " + std::to_string(gpus) +
                                  " GPU(s): NCCL needs one GPU per rank; run at most " + std::to_string(gpus) +
                                  " ranks per host, or in one process with --ranks " + std::to_string(ranks) +
                                  " (in-process ranks share GPU 0)");
}

}  // namespace

StatusOr<DeviceChoice> parse_device_choice(const std::string& s) {
  if (s == "cpu") return DeviceChoice::kCpu;
  if (s == "cuda") return DeviceChoice::kCuda;
  return Status::invalid_argument("unknown device '" + s + "': use cpu or cuda");
}

int ranks_per_gpu(Communicator& world) { return in_process(world) ? world.size() : 1; }

RankDevice make_rank_device(Communicator& world, const RankDeviceOptions& opts) {
  RankDevice rd;
  if (world_from_environment() && (opts.device == DeviceChoice::kCpu || opts.rehearsal))
    check_all_ranks(world, Status::unsupported(
                               std::string(opts.rehearsal ? "a rehearsal" : "the CPU backend") +
                               " moves its ranks' buffers over MPI, and this job was started without it (srun "
                               "without --mpi, or torchrun): run GPU ranks (--device cuda), or start CPU ranks "
                               "with mpirun (srun --mpi=pmix where Slurm's MPI support is set up)" +
                               (opts.rehearsal ? ", or rehearse in one process with --ranks N" : "")));
  if (opts.device == DeviceChoice::kCpu || opts.rehearsal) {
    rd.dev_ = make_cpu_device(CpuDeviceOptions{.threads = opts.device == DeviceChoice::kCpu ? opts.threads : 1,
                                               .budget_bytes = opts.budget_bytes,
                                               .rehearsal = opts.rehearsal});
    rd.comm_ = &world;
    return rd;
  }
  const bool inproc = in_process(world);
  Status before;  // checks that need the whole picture, before any device is made
  if (!inproc) {
    before = check_gpus_per_host();
  } else if (world.size() > 1 && opts.budget_bytes > 0) {
    // The ranks' budgets together must fit in GPU 0 (each device checks only its own).
    world.barrier();  // every rank's device of an earlier run is gone: its memory is free again
    if (world.rank() == 0) {
      auto free_bytes = gpu_free_bytes(0);
      const int64_t total = world.size() * opts.budget_bytes;
      if (!free_bytes.ok()) {
        before = free_bytes.status();
      } else if (total > free_bytes.value()) {
        before = Status::invalid_argument(
            "--mem-budget " + format_bytes(opts.budget_bytes) + " x " + std::to_string(world.size()) +
            " in-process ranks sharing GPU 0 = " + format_bytes(total) + " exceeds the " +
            format_bytes(free_bytes.value()) + " free on it: lower the budget or the ranks");
      }
    }
  }
  StatusOr<int> gpu = gpu_index(world);
  if (before.ok() && !gpu.ok()) before = gpu.status();
  check_all_ranks(world, before);
  auto dev = make_gpu(gpu.value(), opts.budget_bytes);
  check_all_ranks(world, dev.ok() ? Status::ok_status() : dev.status());
  rd.dev_ = std::move(dev).value();
  if (inproc) {
    rd.own_comm_ = world.split(0, world.rank());
    rd.own_comm_->bind_device(*rd.dev_);
  } else {
    auto nccl = make_nccl_communicator(world, *rd.dev_);
    check_all_ranks(world, nccl.ok() ? Status::ok_status() : nccl.status());
    Communicator& ranks = *nccl.value();
    rd.own_comm_ = watch(std::move(nccl).value(), watchdog_options());
    rd.carried_ = carry_world_over(ranks);  // a launched job's world: its agreements over NCCL from now on
  }
  rd.comm_ = rd.own_comm_.get();
  return rd;
}

int64_t agreed_gpu_free_bytes(Communicator& world) {
  const bool inproc = in_process(world);
  Status s = inproc ? Status::ok_status() : check_gpus_per_host();
  int64_t free_bytes = INT64_MAX;
  if (inproc) world.barrier();  // every rank's device of an earlier run is gone
  StatusOr<int> gpu = gpu_index(world);
  if (s.ok() && !gpu.ok()) s = gpu.status();
  if (s.ok() && (!inproc || world.rank() == 0)) {
    auto f = gpu_free_bytes(gpu.value());
    if (f.ok()) free_bytes = f.value();
    else s = f.status();
  }
  check_all_ranks(world, s);
  world.all_reduce(&free_bytes, &free_bytes, 1, DType::kI64, ReduceOp::kMin);
  return free_bytes;
}

namespace {
// MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read.
int64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}
}  // namespace

MachineMemory agreed_machine_memory(Communicator& world, DeviceChoice device, int ranks_per_node) {
  const bool gpu = device == DeviceChoice::kCuda;
  int64_t figures[2] = {host_available_bytes() / 10 * 8 / std::max(ranks_per_node, 1), 0};
  if (gpu) figures[1] = agreed_gpu_free_bytes(world) / 10 * 8 / ranks_per_gpu(world);
  world.all_reduce(figures, figures, 2, DType::kI64, ReduceOp::kMin);
  return MachineMemory{.device = figures[1], .host = figures[0], .shared = !gpu};
}

void fill_hash_uniform_on(Device& dev, const Tensor& t, uint64_t seed, uint64_t stream, int64_t first_index,
                          float scale) {
  if (dev.kind() == DeviceKind::kCpu) return fill_hash_uniform(t, seed, stream, first_index, scale);
  std::vector<unsigned char> host(static_cast<size_t>(t.bytes()));
  fill_hash_uniform(Tensor(host.data(), t.dtype(), t.shape()), seed, stream, first_index, scale);
  dev.copy(t.data(), host.data(), t.bytes());
}

void copy_to_device(Device& dev, const Tensor& t, const void* src) {
  if (dev.kind() == DeviceKind::kCpu) {
    if (t.data() != nullptr) std::memcpy(t.data(), src, static_cast<size_t>(t.bytes()));
    return;
  }
  dev.copy(t.data(), src, t.bytes());
}

std::vector<float> host_f32(Device& dev, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (dev.kind() == DeviceKind::kCpu) {
    load_f32(v.data(), t.data(), t.dtype(), t.numel());
    return v;
  }
  std::vector<unsigned char> raw(static_cast<size_t>(t.bytes()));
  dev.copy(raw.data(), t.data(), t.bytes());
  load_f32(v.data(), raw.data(), t.dtype(), t.numel());
  return v;
}

std::string cpu_kernels_lines(DeviceChoice device) {
  if (device == DeviceChoice::kCuda) return "attention: " + cuda_attention_description() + "\n";
  if (device != DeviceChoice::kCpu) return "";
  const CpuKernelsInfo info = cpu_kernels_info();
  std::string s = "kernels: " + cpu_kernels_description(info) + "\n";
  if (!info.warning.empty()) s += "warning: " + info.warning + "\n";
  return s;
}

}  // namespace untied::cli

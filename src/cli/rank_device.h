// Each rank's Device and the communicator that moves its buffers: the `--device` flag of the
// subcommands.
//
//   --device cpu   (default) a CpuDevice per rank with the rank's threads and budget (a counting
//                  device in rehearsal); the world communicator as it is.
//   --device cuda  a CudaDevice per rank. In-process ranks (--ranks C) all share GPU 0: each
//                  rank's thread makes its own device (allocator, stream), and a split of the
//                  in-process world bound to that device moves the ranks' GPU buffers. Under
//                  mpirun each rank uses the GPU of its local rank and a NCCL communicator made
//                  over the MPI world. In a job started by srun without MPI or torchrun
//                  (launch.h), the same over the rendezvous world, whose agreements then go over
//                  the NCCL communicator while the RankDevice lives.
//   Rehearsal counts on a CPU counting device whatever the choice (no GPU needed); for a GPU
//   rank with one kernel thread, as the GPU kernels take the scratch of the CPU kernels at one
//   thread.
//
// Refusals (no GPU visible, a build without CUDA or NCCL, a budget above the GPU's free memory,
// more ranks on a host than GPUs under mpirun) are agreed over the world with check_all_ranks
// before any compute: every rank stops together, rank 0 prints the one-line reason, and the
// command exits with status 2.
//
// Host agreements (timings, memory figures, gathers for --dump) go over the world communicator,
// which always moves host memory; the rank's own communicator (comm()) is for device buffers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli/launch.h"
#include "untied/comm/communicator.h"
#include "untied/core/status.h"
#include "untied/core/tensor.h"
#include "untied/device/device.h"
#include "untied/train/trainer.h"

namespace untied::cli {

enum class DeviceChoice { kCpu, kCuda };
StatusOr<DeviceChoice> parse_device_choice(const std::string& s);  // "cpu" | "cuda"

struct RankDeviceOptions {
  DeviceChoice device = DeviceChoice::kCpu;
  int threads = 1;           // CPU kernels' threads (cpu only)
  int64_t budget_bytes = 0;  // per rank; 0 = none
  bool rehearsal = false;    // counting CPU device whatever `device` says
};

class RankDevice {
 public:
  Device& dev() { return *dev_; }
  // The communicator for this rank's device buffers: the world (cpu), a split of the
  // in-process world bound to the device, or NCCL.
  Communicator& comm() { return *comm_; }

 private:
  friend RankDevice make_rank_device(Communicator& world, const RankDeviceOptions& opts);
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Communicator> own_comm_;  // declared after dev_, so destroyed before it
  std::unique_ptr<WorldTransport> carried_;  // a launched job's world over own_comm_; destroyed before it
  Communicator* comm_ = nullptr;
};

// Collective over `world`. Refusals throw through check_all_ranks on every rank.
RankDevice make_rank_device(Communicator& world, const RankDeviceOptions& opts);

// The banner line of the CPU kernels ("kernels: OpenBLAS 0.3.21 SkylakeX kernels (OpenMP
// threads), attention tiles avx512 12x32"), with a warning line when they are slower than the
// CPU allows; for a GPU device, which attention kernels run and why ("attention: ...").
std::string cpu_kernels_lines(DeviceChoice device);

// Ranks whose devices share one GPU: the world's size in process, 1 under mpirun (one GPU each).
int ranks_per_gpu(Communicator& world);

// Collective: the smallest free memory over the GPUs the world's ranks use (bytes, as
// cudaMemGetInfo reports it), before any of their devices allocates. Refusals as make_rank_device.
int64_t agreed_gpu_free_bytes(Communicator& world);

// Collective: what an automatic choice may plan one rank to use where no budget says
// (trainer.h MachineMemory), the least over the world's ranks: 80% of its host's available memory
// (MemAvailable) shared by ranks_per_node ranks and, for a GPU rank, 80% of its GPU's free memory
// shared by the ranks on it. The 20% left is for what a plan does not count: the BLAS, MPI and
// CUDA libraries' own memory, fragmentation. Refusals as agreed_gpu_free_bytes (not for a
// rehearsal, which needs no GPU).
MachineMemory agreed_machine_memory(Communicator& world, DeviceChoice device, int ranks_per_node);

// t (memory of dev) = fill_hash_uniform(seed, stream, first_index, scale): generated on the
// host, as on the CPU, and copied to the device when it is not the CPU.
void fill_hash_uniform_on(Device& dev, const Tensor& t, uint64_t seed, uint64_t stream, int64_t first_index,
                          float scale);
// t (memory of dev) = the host values `src` (t.bytes() bytes in t's dtype).
void copy_to_device(Device& dev, const Tensor& t, const void* src);
// The values of t (memory of dev) as float32 on the host.
std::vector<float> host_f32(Device& dev, const Tensor& t);

}  // namespace untied::cli

// How a subcommand gets its ranks:
//   - under mpirun (or srun with PMIx): one MPI process per rank, the MPI world;
//   - started by srun without MPI, or by a torchrun-style launcher: one process per rank, its
//     rank, world size and local rank from the environment (SLURM_PROCID, SLURM_NTASKS,
//     SLURM_LOCALID of an srun task; RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), for GPU
//     ranks only (the CPU backend moves its buffers over MPI). The processes meet in a directory
//     every rank reaches (UNTIED_RENDEZVOUS_DIR; on one node a directory under /tmp by default),
//     through which their first agreements go (untied/comm/file_store.h), NCCL's unique id among
//     them; once the ranks' NCCL communicator is made (rank_device.h) the world's agreements go
//     over it;
//   - otherwise `ranks` threads of this process with the in-process communicator (1 by default).
//
// run_ranks() runs `body` on every rank. An untied::Error thrown on any rank is printed once
// with its rank, and every rank stops: MPI jobs are aborted (MPI_Abort), in-process worlds are
// torn down, a process started from the environment ends and its launcher stops the others
// (srun's --kill-on-bad-exit, torchrun), or their watchdog ends them. Returns the process exit
// code (0 on success, 1 on error, 2 when refused).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "untied/comm/communicator.h"
#include "untied/comm/watchdog.h"
#include "untied/core/status.h"

namespace untied::cli {

enum class Launcher { kNone, kMpi, kSlurm, kTorchrun };

struct LaunchInfo {
  Launcher launcher = Launcher::kNone;
  bool mpi = false;       // launched by mpirun (or srun with PMIx): the MPI world
  bool launched = false;  // one process per rank (mpi, or a launcher's environment with world_size > 1)
  int world_rank = 0;
  int world_size = 1;
  int local_rank = -1;    // among the ranks of this node; -1 where the launcher does not say
  int local_size = 1;     // ranks of this job on this node
  int nodes = 0;          // nodes of the job where the launcher says (0: unknown)
  std::string job;        // the job's name for its rendezvous ("slurm-1234.0", "torchrun-none-host-29500-0")
  std::string source;     // where the figures came from, for messages ("SLURM_PROCID=3 SLURM_NTASKS=4 ...")
  Status problem;         // a variable that is not a number, or a rank outside the world
};

// This process's launch as its environment says; valid before MPI init.
LaunchInfo launch_info();
// The same from any environment (`get` returns a variable's value or null): for the tests.
LaunchInfo launch_info_from(const std::function<const char*(const char*)>& get);

// Ranks of this job on this machine (1 when not launched).
int local_ranks_launched();
// This process's rank among them (-1 when the launcher does not say).
int local_rank_launched();
// The GPU a rank of a launched job uses, of the `visible` ones: the only one where one is visible
// (the launcher gave each rank its own, e.g. srun --gpus-per-task=1), else its local rank; an
// error where the local rank is unknown or has no GPU.
StatusOr<int> gpu_for_local_rank(int local_rank, int visible);

// The job's rendezvous directory for a launch from the environment: UNTIED_RENDEZVOUS_DIR/<job>,
// else /tmp/untied-rendezvous-<job> when every rank is on this node; an error naming the variable
// to set otherwise.
StatusOr<std::string> rendezvous_dir(const LaunchInfo& li, const char* env_dir);

// In a job launched from the environment: the world's agreements go over `device_comm` (the ranks'
// NCCL communicator) until the returned handle is destroyed, then through the rendezvous
// directory again. Null (nothing to do) in any other world.
class WorldTransport {
 public:
  virtual ~WorldTransport() = default;
};
std::unique_ptr<WorldTransport> carry_world_over(Communicator& device_comm);
// Whether this process's world is one launched from the environment (after run_ranks began).
bool world_from_environment();

// BLAS/OpenMP threads per rank so that ranks x threads fills the cores: cores / ranks_here, >= 1.
int default_threads_per_rank(int ranks_here);

// Collective agreement on a check made before any compute: when `s` is not ok on any rank, the
// lowest failing rank prints its message, and every rank throws RefusedOnAllRanks, which
// run_ranks turns into exit code 2 without aborting (every rank stops together, none hangs).
void check_all_ranks(Communicator& comm, const Status& s);

// Every communicator run_ranks makes (and the device communicators made from it) is watched
// (untied/comm/watchdog.h) with this timeout: --collective-timeout, 600 s unless a command sets
// it (0: off). Set before run_ranks.
void set_collective_timeout(double seconds);
double collective_timeout();
// --verify-schedule (or UNTIED_VERIFY_SCHEDULE=1 in the environment, as the tests set it): the
// ranks check that they call the same collectives in the same order (watchdog.h).
void set_verify_schedule(bool on);
// The watchdog's options for this process: the timeout and the schedule check.
WatchdogOptions watchdog_options();
int run_ranks(int* argc, char*** argv, int inproc_ranks, const std::function<void(Communicator&)>& body);

}  // namespace untied::cli

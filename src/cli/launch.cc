#include "cli/launch.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <cstdio>
#include <string>
#include <cstdlib>
#include <exception>

#include "untied/comm/inproc.h"
#include "untied/comm/mpi.h"
#include "untied/comm/watchdog.h"
#include "untied/core/check.h"

namespace untied::cli {

LaunchInfo launch_info() {
  LaunchInfo info;
  info.mpi = MpiSession::launched_by_mpirun();
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) {
      info.world_rank = std::atoi(v);
      break;
    }
  }
  return info;
}

int local_ranks_under_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return 1;
}

int local_rank_under_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return -1;
}

int default_threads_per_rank(int ranks_here) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_here));
}

namespace {
// Thrown on every rank at once by check_all_ranks; already reported.
struct RefusedOnAllRanks {};
}  // namespace

void check_all_ranks(Communicator& comm, const Status& s) {
  const Status first = first_failure(comm, s);
  if (first.ok()) return;
  if (comm.rank() == 0) {
    std::fprintf(stderr, "untied: %s\n", first.message().c_str());
    std::fflush(stderr);
  }
  throw RefusedOnAllRanks{};
}

namespace {
double g_collective_timeout_s = 600;

bool g_verify_schedule = false;
}  // namespace

void set_collective_timeout(double seconds) { g_collective_timeout_s = seconds; }
double collective_timeout() { return g_collective_timeout_s; }
void set_verify_schedule(bool on) { g_verify_schedule = on; }
WatchdogOptions watchdog_options() {
  const char* env = std::getenv("UNTIED_VERIFY_SCHEDULE");
  return WatchdogOptions{.timeout_s = g_collective_timeout_s,
                         .verify_schedule = g_verify_schedule || (env != nullptr && std::string(env) == "1")};
}

int run_ranks(int* argc, char*** argv, int inproc_ranks, const std::function<void(Communicator&)>& body) {
  const WatchdogOptions watchdog = watchdog_options();
  if (launch_info().mpi && watchdog.timeout_s > 0) {
    // The processes of this job say where they are in one directory, so that a stuck one can name
    // the ranks that never reached its collective: UNTIED_WATCHDOG_DIR (one every node reaches),
    // else one per job under /tmp (the ranks of this node).
    const char* dir = std::getenv("UNTIED_WATCHDOG_DIR");
    std::string job;
    for (const char* var : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"})
      if (const char* v = std::getenv(var); v != nullptr && job.empty()) job = v;
    if (const char* step = std::getenv("SLURM_STEP_ID"); step != nullptr && !job.empty()) job += std::string(".") + step;
    if (dir != nullptr && *dir != '\0') set_watchdog_dir(dir);
    else if (!job.empty()) set_watchdog_dir("/tmp/untied-watchdog-" + job);
  }
  if (launch_info().mpi) {
    MpiSession session(argc, argv);
    std::unique_ptr<Communicator> world = watch(session.world(), watchdog);
    try {
      body(*world);
    } catch (const RefusedOnAllRanks&) {
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "untied: error: %s\n", e.what());
      std::fflush(stderr);
      if (world->size() > 1) world->abort(1);  // stops every rank; does not return
      return 1;
    }
    return 0;
  }
  std::atomic<bool> refused{false};
  try {
    run_in_process(inproc_ranks, [&](Communicator& plain) {
      const std::unique_ptr<Communicator> comm = watch(plain, watchdog);
      try {
        body(*comm);
      } catch (const RefusedOnAllRanks&) {
        refused = true;  // every rank sets it; reported already
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "untied: error: %s\n", e.what());
    return 1;
  }
  return refused ? 2 : 0;
}

}  // namespace untied::cli

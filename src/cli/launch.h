// How a subcommand gets its ranks: under mpirun, one MPI process per rank; otherwise `ranks`
// threads of this process with the in-process communicator (1 by default).
//
// run_ranks() runs `body` on every rank. An untied::Error thrown on any rank is printed once
// with its rank, and every rank stops: MPI jobs are aborted (MPI_Abort), in-process worlds are
// torn down. Returns the process exit code (0 on success, 1 on error).
#pragma once

#include <functional>

#include "untied/comm/communicator.h"
#include "untied/comm/watchdog.h"
#include "untied/core/status.h"

namespace untied::cli {

struct LaunchInfo {
  bool mpi = false;  // launched by mpirun
  int world_rank = 0;
};

// Rank of this process as mpirun reports it (0 when not under mpirun); valid before MPI init.
LaunchInfo launch_info();

// Ranks of this job on this machine (mpirun's local size; 1 when not under mpirun).
int local_ranks_under_mpirun();
// This process's rank among them (mpirun's local rank; -1 when mpirun does not say).
int local_rank_under_mpirun();
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

// How a subcommand gets its ranks: under mpirun, one MPI process per rank; otherwise `ranks`
// threads of this process with the in-process communicator (1 by default).
//
// run_ranks() runs `body` on every rank. An untied::Error thrown on any rank is printed once
// with its rank, and every rank stops: MPI jobs are aborted (MPI_Abort), in-process worlds are
// torn down. Returns the process exit code (0 on success, 1 on error).
#pragma once

#include <functional>

#include "untied/comm/communicator.h"

namespace untied::cli {

struct LaunchInfo {
  bool mpi = false;  // launched by mpirun
  int world_rank = 0;
};

// Rank of this process as mpirun reports it (0 when not under mpirun); valid before MPI init.
LaunchInfo launch_info();

int run_ranks(int* argc, char*** argv, int inproc_ranks, const std::function<void(Communicator&)>& body);

}  // namespace untied::cli

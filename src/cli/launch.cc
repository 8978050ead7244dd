#include "cli/launch.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "untied/comm/inproc.h"
#include "untied/comm/mpi.h"
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

int run_ranks(int* argc, char*** argv, int inproc_ranks, const std::function<void(Communicator&)>& body) {
  if (launch_info().mpi) {
    MpiSession session(argc, argv);
    std::unique_ptr<Communicator> world = session.world();
    try {
      body(*world);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "untied: error: %s\n", e.what());
      std::fflush(stderr);
      if (world->size() > 1) world->abort(1);  // stops every rank; does not return
      return 1;
    }
    return 0;
  }
  try {
    run_in_process(inproc_ranks, body);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "untied: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace untied::cli

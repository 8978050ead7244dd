// The MPI communicator (Open MPI). MpiSession initialises MPI for the process (thread level
// FUNNELED) and finalises it; world() gives a Communicator over MPI_COMM_WORLD.
// MPI headers are included only under src/comm/mpi.
#pragma once

#include <memory>

#include "untied/comm/communicator.h"

namespace untied {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  std::unique_ptr<Communicator> world();
  // True when this process was started by mpirun/srun with more than one rank, or MPI env vars
  // are present.
  static bool launched_by_mpirun();
};

}  // namespace untied

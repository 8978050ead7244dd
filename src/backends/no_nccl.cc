// The answers of a build without NCCL (compiled only then; see CMakeLists.txt). Every rank
// returns the same Status without communicating, so no rank waits for another.
#include "untied/comm/nccl.h"

namespace untied {

bool nccl_built() { return false; }

StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator&, Device&) {
  return Status::unsupported(
      "this build has no NCCL: NCCL is built with the CUDA backend when CMake finds nccl.h and libnccl "
      "(the CUDA toolkit's, $NCCL_HOME, or the nvidia-nccl Python wheel); install NCCL or set NCCL_HOME "
      "and rebuild, or run the ranks in one process with --ranks N (the in-process communicator)");
}

StatusOr<std::string> nccl_unique_id() { return Status::unsupported("this build has no NCCL"); }

}  // namespace untied

// Backend-neutral helpers over the Communicator interface.
#include "untied/comm/communicator.h"

#include <cstdint>

namespace untied {

// One int64 min-reduction: 1 survives only if every rank passed 1.
bool all_ranks_ok(Communicator& comm, bool ok) {
  int64_t v = ok ? 1 : 0;
  comm.all_reduce(&v, &v, 1, DType::kI64, ReduceOp::kMin);
  return v == 1;
}

}  // namespace untied

// UNTIED_NCCL_CHECK(stmt): runs an NCCL call and on any result other than ncclSuccess throws
// untied::Error(kInternal) naming the statement, NCCL's error string, NCCL's last error message
// (when it has one) and the rank:
//   rank 1: src/backends/nccl/nccl_communicator.cc:210: ncclAllReduce(...) -> invalid argument (run
//   with NCCL_DEBUG=WARN for details): <ncclGetLastError text>
// NCCL headers are included only under src/backends/nccl.
#pragma once

#include <nccl.h>

#include <string>

#include "untied/core/check.h"

namespace untied {

[[noreturn]] inline void nccl_fail(ncclResult_t rc, const char* stmt, const char* file, int line) {
  std::string what = error_prefix(file, line) + stmt + " -> " + ncclGetErrorString(rc);
  const char* last = ncclGetLastError(nullptr);  // the argument is unused by NCCL
  if (last != nullptr && last[0] != '\0') what += std::string(": ") + last;
  fail(ErrorKind::kInternal, what);
}

}  // namespace untied

#define UNTIED_NCCL_CHECK(stmt)                                               \
  do {                                                                        \
    const ncclResult_t untied_nccl_rc_ = (stmt);                              \
    if (untied_nccl_rc_ != ncclSuccess) [[unlikely]]                          \
      ::untied::nccl_fail(untied_nccl_rc_, #stmt, __FILE__, __LINE__);        \
  } while (0)

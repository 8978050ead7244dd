// Error checking and size helpers for the MPI backend.
//
// UNTIED_MPI_CHECK(stmt) evaluates an MPI call that returns an error code. On any code other
// than MPI_SUCCESS it throws untied::Error(kInternal) whose message reads
//     rank 2: src/comm/mpi/mpi_communicator.cc:88: MPI_Alltoall(...) -> MPI_ERR_TRUNCATE: ...
// The communicators set MPI_ERRORS_RETURN, so failures come back as codes instead of aborting.
//
// This header does not include <mpi.h>: the macro names MPI_SUCCESS, which resolves where it
// is expanded (only in files under src/comm/mpi). That lets tests include it for the pure size
// helper below without seeing MPI.
#pragma once

#include <cstdint>

namespace untied {

// Throws Error(kInternal) with "<prefix><stmt> -> <MPI error string>". Defined with the backend.
[[noreturn]] void mpi_fail(int rc, const char* stmt, const char* file, int line);

// MPI counts are int. A byte transfer of `bytes` is sent as `count` items of a contiguous
// datatype of `unit_bytes` (a power of two dividing `bytes`), with count <= INT_MAX.
// unit_bytes == 1 (plain MPI_BYTE) whenever bytes <= INT_MAX; otherwise the smallest unit that
// brings the count under INT_MAX.
// REQUIRES: bytes >= 0. Throws Error(kUnsupported) when no such unit divides `bytes` (for
// example an odd size above INT_MAX), naming the size and what to change.
struct MpiByteLayout {
  int64_t unit_bytes;
  int64_t count;
};
MpiByteLayout mpi_byte_layout(int64_t bytes);

}  // namespace untied

#define UNTIED_MPI_CHECK(stmt)                                       \
  do {                                                               \
    int untied_mpi_rc_ = (stmt);                                     \
    if (untied_mpi_rc_ != MPI_SUCCESS) [[unlikely]] {                \
      ::untied::mpi_fail(untied_mpi_rc_, #stmt, __FILE__, __LINE__); \
    }                                                                \
  } while (0)

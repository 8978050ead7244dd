// Communicator: the collectives untied needs, over a group of ranks.
//
// Backends: MPI (one process per rank, launched with mpirun; comm/mpi), in-process (one thread per
// rank inside one process; comm/inproc), NCCL (one GPU per rank, bootstrapped through MPI;
// comm/nccl) and the file store (processes that share a directory, for launchers without MPI;
// comm/file_store.h). The same exact checks run on all (tests/comm, tests/nccl).
//
// Conventions for every collective:
//   - Buffers are memory of the rank's device (bind_device; host memory until one is bound) or
//     host memory; sizes are 64-bit.
//   - Every rank of the group calls the collective with the same sizes. Blocks are laid out by
//     rank: block p of a send buffer goes to rank p; block p of a receive buffer came from p.
//   - Send and receive buffers must not overlap, except all_reduce (send == recv is allowed).
//   - Reductions support f32, f64, i32, i64; bf16 fails with "<backend> does not support ...".
//   - Blocking: when a call returns, the receive buffer holds the result and the send buffer
//     may be reused.
// Failure: a failed call throws untied::Error. If another rank of an in-process world has
// failed, blocked calls throw Error(kAborted) instead of hanging; abort() stops every rank of
// an MPI job.
//
// Thread safety: a Communicator belongs to one rank (one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "untied/core/dtype.h"
#include "untied/core/status.h"
#include "untied/device/device.h"

namespace untied {

enum class ReduceOp { kSum, kMax, kMin };

// A sendrecv or all_to_all in flight (Communicator::sendrecv_start, all_to_all_start). Its buffers belong to the transfer until
// wait() returns: then the receive buffer holds the data (on a GPU, for work issued on the bound
// device's stream after the call) and the send buffer may be reused. Destroying it without
// wait() waits (errors are then dropped: call wait() to see them).
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "inproc", "nccl", "file"

  // Tells the communicator where this rank's buffers live, before its first collective with
  // device memory. The in-process communicator then moves bytes with the device's copies (a GPU's
  // device-to-device copy when ranks share a GPU) and waits for the device's work before each
  // exchange. MPI accepts only CPU devices (GPU ranks use NCCL): Error(kUnsupported) otherwise.
  // The device must outlive the communicator's use of it.
  virtual void bind_device(Device& dev) = 0;

  // Collective over this group: ranks with equal `color` form a new group, ordered by
  // (key, rank). Every rank of the group must call it.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // send: size() blocks of block_bytes; recv: size() blocks of block_bytes.
  virtual void all_to_all(const void* send, void* recv, int64_t block_bytes) = 0;
  // All-to-all of blocks of any size (the experts' rows of a mixture of experts): send holds
  // size() blocks back to back, block p (send_bytes[p] bytes) for rank p; recv receives rank p's
  // block (recv_bytes[p] bytes, which must be what p sends here) at the sum of the earlier
  // recv_bytes. The default runs size() rounds of sendrecv (round s: to rank + s, from rank - s);
  // MPI overrides it with MPI_Alltoallv, NCCL with one group of sends and receives.
  virtual void all_to_allv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>& recv_bytes);
  // send: block_bytes; recv: size() blocks of block_bytes (rank p's block at p).
  virtual void all_gather(const void* send, void* recv, int64_t block_bytes) = 0;
  // send: size() blocks of block_elems; recv: block_elems = op over ranks of block rank().
  virtual void reduce_scatter(const void* send, void* recv, int64_t block_elems, DType dtype,
                              ReduceOp op) = 0;
  // recv[i] = op over ranks of send[i]; send == recv allowed.
  virtual void all_reduce(const void* send, void* recv, int64_t elems, DType dtype, ReduceOp op) = 0;
  // buf of `bytes` on every rank gets root's contents.
  virtual void broadcast(void* buf, int64_t bytes, int root) = 0;
  // Sends send_bytes to `dest` and receives recv_bytes from `src` (both may be rank()).
  virtual void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv,
                        int64_t recv_bytes, int src) = 0;
  // The same exchange, started and left in flight so that compute can run meanwhile (the ring's
  // next block while the current one is attended to): nonblocking MPI, a communication stream
  // on a GPU. Every rank starts and waits its exchanges in the same order. The default (a
  // backend without its own) runs the blocking sendrecv in wait().
  virtual std::unique_ptr<PendingExchange> sendrecv_start(const void* send, int64_t send_bytes, int dest,
                                                          void* recv, int64_t recv_bytes, int src);
  // all_to_all, started and left in flight (UPipe's next stage exchanged while this one is
  // attended to): MPI_Ialltoall, a communication stream on a GPU. A collective like the others:
  // every rank of the group starts it in the same order relative to every other collective of
  // the group, and waits for it before its buffers are touched. The default (a backend without
  // its own, and the in-process one, whose ranks copy with the cores that compute) runs the
  // blocking all_to_all in wait().
  virtual std::unique_ptr<PendingExchange> all_to_all_start(const void* send, void* recv, int64_t block_bytes);
  virtual void barrier() = 0;
  // Stops every rank of the job (MPI_Abort; in-process: marks the world failed). Does not return
  // for MPI.
  virtual void abort(int code) noexcept = 0;
  // Called from another thread (the watchdog's) when this rank's call is stuck and the process is
  // about to end: cancels the device work this communicator has in flight (NCCL: ncclCommAbort),
  // so that no collective kernel outlives the job. The communicator is unusable afterwards, and
  // the rank's own thread, still inside the stuck call, is parked rather than woken. Returns a
  // line saying what was done, or "" when nothing was (the default: host transports end with
  // the process).
  virtual std::string cancel_in_flight() noexcept { return ""; }
};

// Result of an agreement over ranks: true on every rank iff `ok` is true on every rank.
// Used so that a failure found by one rank makes every rank fail together.
bool all_ranks_ok(Communicator& comm, bool ok);

// Collective: ok on every rank when `s` is ok on every rank; otherwise, on every rank, the
// Status of the lowest failing rank (its message prefixed with "rank r: " when size() > 1).
Status first_failure(Communicator& comm, const Status& s);

}  // namespace untied

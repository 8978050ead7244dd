// The collective watchdog: nothing hangs silently.
//
// watch(inner, options) returns a Communicator that forwards every call to `inner` and records
// the call while it is in flight: the op, its call number on this communicator, its bytes, the
// peer or the group (rank of size, backend), and what the rank was doing (watchdog_note: "step 3,
// backward"), noted by the calling thread. One monitor thread per process looks at every call in
// flight once a second; one that has not returned within options.timeout_s makes it print, for
// every rank of this process that is stuck, one line saying what it is stuck in, e.g.
//   untied: watchdog: rank 2 of 4 (mpi) stuck 600.0 s in all_to_all #1817 (2.00 MiB per block),
//     step 3, backward, layer 5; before it: all_gather #1816 in 0.020 s, ...; the job is aborted
//     (--collective-timeout 600)
// with the last calls it finished (a small flight recorder), and a line naming the ranks of that
// communicator that never began the call (set_watchdog_dir: the other processes' heartbeats):
//   untied: watchdog: all_to_all #1817 (...); rank 1 never began it: its last call was
//     all_gather #1816 (...) at step 3, backward, ended 598.2 s ago
// and then cancel the device work of the stuck communicators (Communicator::cancel_in_flight:
// ncclCommAbort on NCCL, saying so) and end the process with exit status 124 (under mpirun the
// other processes are then stopped by mpirun; their own watchdogs name their calls first when
// they are stuck too).
// timeout_s 0 turns the watchdog off (watch returns `inner` unwrapped unless verify_schedule).
// split() of a watched communicator is watched; the exchange of sendrecv_start and of
// all_to_all_start is watched until its wait() returns (so the compute it overlaps counts
// towards the timeout).
//
// Thread safety: as Communicator (one rank, one thread); the monitor only reads the records.
#pragma once

#include <memory>
#include <string>

#include "untied/comm/communicator.h"

namespace untied {

struct WatchdogOptions {
  double timeout_s = 600;  // 0: off
  // Before each collective (not the point-to-point sendrecv), the ranks exchange what they are
  // about to call (op, bytes, call number, note: 128 bytes) and stop with an error naming both
  // sides when they differ, instead of hanging or mixing buffers. On every backend: NCCL and a
  // GPU-bound in-process communicator stage the records through the device, and on NCCL each
  // check waits for the exchanges queued before it (so it serialises UPipe's overlap).
  bool verify_schedule = false;
};

std::unique_ptr<Communicator> watch(std::unique_ptr<Communicator> inner, const WatchdogOptions& options);
// The same over a communicator owned elsewhere (which must outlive the result); with timeout_s 0
// the result forwards every call without recording it.
std::unique_ptr<Communicator> watch(Communicator& inner, const WatchdogOptions& options);

// Where the processes of a job say where they are (a file per process, rewritten every second:
// each watched communicator's rank, its calls begun and ended, the last one and the rank's note),
// so that a rank stuck in a collective can name the ranks that never began it, in other processes
// too. A directory every process of the job can reach (on one node /tmp; across nodes a shared
// one); empty: none (the ranks of one process still see each other). Set before any rank starts.
void set_watchdog_dir(const std::string& dir);

// What the calling thread (a rank) is doing, for the watchdog's message, kept until replaced:
// level 0 the step ("step 3"; setting it clears level 1), level 1 where in it ("backward, block 5").
void watchdog_note(int level, const std::string& note);

}  // namespace untied

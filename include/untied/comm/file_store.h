// The file-store communicator: processes (or threads) that share a directory act as ranks, and
// every collective goes through files in it. Host memory only; no sockets, no MPI.
//
// It is the bootstrap world of a job whose launcher gives each process a rank and a world size
// but no MPI (srun, a torchrun-style launcher): small host agreements (rank checks, an NCCL
// unique id broadcast, a refusal agreed on every rank). Each collective costs a few file
// creations per rank: correct and clear, not fast; bulk traffic belongs to NCCL or MPI.
//
//   FileStoreOptions o{.dir = "/shared/jobs/42/store", .rank = r, .size = n,
//                      .note = "host n1, pid 42, SLURM_PROCID=3"};
//   StatusOr<std::unique_ptr<Communicator>> world = join_file_store(o);
//   if (!world.ok()) { print(world.status().message()); return 2; }
//
// The directory (one per job; created with its parents if missing) holds:
//   rank_<r>                  rank r's registration: the world size, its note, and on rank 0 the
//                             job's token (random), kept until rank r's world is destroyed;
//   <token>/<id>/             one folder per communicator: "w" for the world, "<parent>.s<k>c<c>"
//                             for colour c of the parent's k-th split;
//   <token>/<id>/c<n>.r<r>    rank r's contribution to the communicator's n-th collective;
//   <token>/<id>/m<s>-<d>.<k> the k-th sendrecv message from s to d (the receiver deletes it);
//   <token>/<id>/bye.r<r>     rank r destroyed this communicator;
//   <token>/abort             written by abort(): which rank, which code.
// Every file appears complete (written aside, then renamed or linked into place). A rank deletes
// its contribution to collective n when it enters collective n + 2 (every rank has then read it);
// the rank that finds every bye file removes the communicator's folder, and the last rank out
// removes the directory if nothing else is left in it. The token keeps a job apart from the
// leftovers of an earlier one in the same directory.
//
// Conventions are those of Communicator (communicator.h). Every collective, broadcast and barrier
// included, waits for every rank of the group; reductions run in rank order 0..n-1, so results
// are bitwise identical on every rank. A rank that finds another rank in a different collective,
// or with different sizes, throws kInvalidArgument. sendrecv is point to point: messages are
// buffered in files, so ring patterns do not deadlock. sendrecv_start and all_to_all_start are
// the base class's defaults (the blocking call runs in wait()).
//
// Failure, never a hang: a rank that waits longer than timeout_s for the others in a collective
// (or for a sendrecv message) throws Error(kIo) naming the call, its number and the ranks whose
// files never came; a rank waiting while another has called abort() throws Error(kAborted)
// naming that rank. (untied has no timeout kind: kIo says the shared directory did not deliver.)
// Argument errors found before communicating (bf16 reductions, a root, dest or src outside the
// group, a negative split colour) leave the communicator usable; after any other failure it is
// not, as an MPI communicator after an error.
//
// The filesystem must show a file created on one node to an open() on another: local disks,
// Lustre and GPFS do at once. An NFS client may keep believing a name absent until its cache of
// the directory expires (lookupcache, acdirmin: seconds per wait); mount with
// lookupcache=positive, or expect collectives that take that long.
//
// Thread safety: a communicator belongs to one rank (one thread). Several ranks may live in one
// process, each with its own communicator over the same directory (the tests do).
#pragma once

#include <memory>
#include <string>

#include "untied/comm/communicator.h"
#include "untied/core/status.h"

namespace untied {

struct FileStoreOptions {
  std::string dir;          // one directory per job, every rank reaches it (created if missing, parents too)
  int rank = 0;
  int size = 1;
  double timeout_s = 300;   // how long a rank waits for the others: at join and in each collective
  std::string note;         // how this rank describes itself in others' errors, e.g. "host n1, pid 42,
                            // SLURM_PROCID=3"; empty: "host <hostname>, pid <pid>"
};

// Collective over `size` processes (or threads): each registers as `rank`, waits for every rank
// to register, checks that they agree on `size`, then waits until every rank has read every
// registration. Registers `rank` as this thread's rank for check messages (set_thread_rank).
// backend() of the result is "file"; bind_device accepts a CPU device only (kUnsupported
// otherwise).
// Errors (a Status, never a hang):
//   invalid_argument  rank outside [0, size), size < 1, no dir, timeout_s not > 0;
//                     rank_<rank> already exists (another process holds the rank, named by its
//                     note, or an earlier job left it: remove DIR or use a new one);
//                     a rank registered with another size (names it, its note, both sizes);
//   io_error          DIR cannot be created or written; ranks missing after timeout_s (names
//                     them, and asks whether DIR is shared and the size right); every rank
//                     registered but some never confirmed (a stale registration);
//   corrupt           a registration that is not one.
// A rank refused for a size mismatch leaves its registration, so the others see why; one that
// timed out removes it.
StatusOr<std::unique_ptr<Communicator>> join_file_store(const FileStoreOptions& options);

}  // namespace untied

// Exact checks of every Communicator call, shared by the in-process and the MPI tests so the
// same checks run on every backend at every rank count.
//
// Each check is collective over `comm`: every rank calls the same check, in the same order.
// It fills every sent element from its global coordinates, value = f(src rank, dst rank,
// index), exactly representable, so each rank knows what it must receive without
// communicating; receive buffers start as the complement of what must arrive, so an element
// left unwritten is caught too. Every received element is compared exactly; the first few
// mismatches are printed to stderr with the rank, the call, the size and the index.
//
// Returns: the number of wrong elements (or wrong results) on this rank; 0 = pass.
// Sizes cover empty blocks, odd byte counts and buffers of a few MB.
#pragma once

#include <cstdint>
#include <vector>

#include "untied/comm/communicator.h"

namespace untied::testing {

// send block p (value f(me, p, i)) goes to rank p.
int64_t check_all_to_all(Communicator& comm);
// all_to_all_start: two in flight around a blocking all_reduce, waited for in reverse order, one
// dropped without wait(), and an empty one.
int64_t check_all_to_all_start(Communicator& comm);
int64_t check_all_to_allv(Communicator& comm);
// every rank receives every rank's block (value f(src, i)).
int64_t check_all_gather(Communicator& comm);
// f32/f64/i32/i64 x sum/max/min: block `me` of the op over all ranks.
int64_t check_reduce_scatter(Communicator& comm);
// f32/f64/i32/i64 x sum/max/min, in and out of place.
int64_t check_all_reduce(Communicator& comm);
// from every root.
int64_t check_broadcast(Communicator& comm);
// ring shifts both ways with unequal send/receive sizes, a full ring pass of n-1 steps, and
// a send to self.
int64_t check_sendrecv(Communicator& comm);
// sendrecv_start: a ring pass with two exchanges of different sizes in flight at once (the ring
// attention backward's K/V block and its dk/dv sums), each waited for after the next starts.
int64_t check_sendrecv_start(Communicator& comm);
// even/odd colours with reversed keys, one colour, one rank per colour, a nested split; the
// new rank and size, then collectives (including the checks above) on the subgroup.
int64_t check_split(Communicator& comm);
// no rank leaves a barrier before the last one entered (steady_clock; ranks on one host).
int64_t check_barrier(Communicator& comm);
// all_ranks_ok agrees: true only when every rank passes true.
int64_t check_all_ranks_ok(Communicator& comm);
// hundreds of small collectives back to back (catches barrier reuse races).
int64_t check_many_small(Communicator& comm);
// Local argument errors every backend reports before communicating: bf16 reductions
// (kUnsupported, "does not support reduce on bf16"), a root, dest or src outside the group,
// a negative split colour, and a sendrecv to self of fewer bytes than the receiver expects
// (kInvalidArgument).
int64_t check_argument_errors(Communicator& comm);

struct CommCheck {
  const char* name;
  int64_t (*run)(Communicator& comm);
};

// Every check above, in a fixed order (the test tables iterate it).
const std::vector<CommCheck>& comm_checks();

}  // namespace untied::testing

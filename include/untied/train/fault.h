// Fault injection, for the tests of what untied does when things go wrong: the environment
// variable UNTIED_FAULT names one fault, as KIND:key=value:key=value...
//
//   nan-grad:step=S[:rank=R][:param=I]   after step S's backward, a NaN in parameter I's gradient
//                                        shard (default 0) on rank R (default every rank)
//   nan-loss:step=S[:rank=R]             step S's loss sum becomes NaN on rank R
//   nan-weight:step=S[:rank=R][:param=I] before step S, a NaN in parameter I's master shard: the
//                                        forward overflows from that parameter's block on
//   stall:step=S[:rank=R][:at=forward]   at the start of step S (at=forward: after its data
//                                        phase, so that the others wait in the device
//                                        communicator's collective, NCCL on GPUs) the rank stops
//                                        making progress (sleeps for ever): what a hung GPU or a
//                                        lost peer looks like
//   exit:step=S[:rank=R]                 at the start of step S the process exits with status 3
//   barrier:step=S[:rank=R][:at=forward] at the start of step S (at=forward: on the device
//                                        communicator, before the forward) the rank calls a
//                                        barrier the others do not (a schedule bug:
//                                        --verify-schedule names it)
//   kill:at=POINT[:step=S][:rank=R]      the process kills itself (SIGKILL, as `kill -9` would) on
//                                        reaching POINT (of the save of step S, when given):
//                                          save-begin        before anything of the save is written
//                                          save-rank-file    this rank's file written, not yet renamed
//                                          save-before-latest every rank's file in place, `latest`
//                                                            not yet replaced
//                                          save-latest-tmp   the new `latest` written, not yet renamed
// Unset or empty: no fault. A malformed value is a fatal error naming it (tests must not run
// without the fault they ask for). Nothing here is for users; the flags that handle faults are.
#pragma once

#include <cstdint>
#include <string>

#include "untied/comm/communicator.h"

namespace untied {

enum class FaultKind { kNone, kNanGradient, kNanLoss, kNanWeight, kStall, kExit, kBarrier, kKill };

struct Fault {
  FaultKind kind = FaultKind::kNone;
  int64_t step = -1;   // -1: any step
  int rank = -1;       // -1: every rank
  int param = 0;       // kNanGradient
  std::string at;      // kKill: the point
};

// The fault UNTIED_FAULT names, if it applies to `rank`; kNone otherwise.
Fault fault_from_environment(int rank);

// kStall, kExit and kBarrier without at=, when `f` is one of them for this step: stalls, exits or
// calls comm.barrier() here.
void fault_at_step_start(const Fault& f, int64_t step, Communicator& comm);

// kStall and kBarrier with at=forward, for this step: stalls here, or calls dev_comm.barrier().
void fault_before_forward(const Fault& f, int64_t step, Communicator& dev_comm);

// Kills this process when UNTIED_FAULT is kill:at=`point` for this rank and step (-1: any).
void fault_point(const char* point, int64_t step, int rank);

}  // namespace untied

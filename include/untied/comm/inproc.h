// The in-process communicator: `ranks` threads in one process act as ranks; collectives are
// memory copies between them. Used by tests (fast, no mpirun) and to run several ranks on one
// device.
//
//   run_in_process(4, [&](Communicator& comm) { ... });   // body runs on 4 threads
//
// If the body throws on any rank, the world is marked failed: every other rank's pending or
// next collective throws Error(kAborted), all threads are joined, and run_in_process rethrows
// the first non-abort error. Nothing hangs.
#pragma once

#include <functional>

#include "untied/comm/communicator.h"

namespace untied {

void run_in_process(int ranks, const std::function<void(Communicator&)>& body);

}  // namespace untied

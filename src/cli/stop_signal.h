// Preemption: SIGTERM, SIGINT and SIGUSR1 (what Slurm's --signal, a scheduler's preemption and
// Ctrl-C send; mpirun forwards SIGUSR1 to every rank, and SIGTERM and SIGINT as a SIGTERM before
// the SIGKILL that follows odls_base_sigkill_timeout seconds later) ask `untied train` to stop:
// the first one is recorded (stop_request) and the run ends after the step in progress, on every
// rank together, with a checkpoint (TrainOptions::stop_request). The same signal a second time
// ends the process at once (its default action): a save cut short leaves the previous checkpoint
// intact. Another of the three after the first (mpirun's SIGTERM relaying a terminal's SIGINT) is
// not a second request.
//
// Process-wide by nature (signal handlers): install once, before any rank starts.
#pragma once

#include <atomic>

namespace untied::cli {

// The exit status of a run that stopped for a signal after saving a checkpoint to resume from:
// EX_TEMPFAIL of sysexits.h ("try again"), for job scripts that requeue (Slurm's --requeue).
inline constexpr int kExitPreempted = 75;

// Installs the handlers; `announce`: this process prints the one line that says a stop was asked
// for (rank 0 of the job).
void install_stop_signals(bool announce);
// The signal that asked to stop, 0 before any: what TrainOptions::stop_request points at.
const std::atomic<int>* stop_request();
// "SIGTERM", "SIGINT", "SIGUSR1" (or "signal N").
const char* stop_signal_name(int sig);

}  // namespace untied::cli

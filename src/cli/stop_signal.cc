// Stop signals (stop_signal.h).
#include "cli/stop_signal.h"

#include <csignal>
#include <cstring>
#include <unistd.h>

namespace untied::cli {
namespace {

std::atomic<int> g_stop{0};
bool g_announce = false;

extern "C" void on_stop_signal(int sig) {
  const int first = g_stop.load();
  if (first == sig) {  // the same signal again: at once, as if nothing handled it
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (first != 0) return;  // (mpirun relaying as SIGTERM the SIGINT the ranks got too)
  g_stop.store(sig);
  if (g_announce) {  // write(2) alone: async-signal-safe
    const char msg[] =
        "\nuntied train: stop asked for: the run ends after this step, with a checkpoint where --checkpoint-dir is "
        "set (the same signal again ends it at once)\n";
    [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof msg - 1);
  }
}

}  // namespace

void install_stop_signals(bool announce) {
  g_announce = announce;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads, writes and waits go on; only the flag changes
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

const std::atomic<int>* stop_request() { return &g_stop; }

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace untied::cli

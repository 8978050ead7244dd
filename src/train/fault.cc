// UNTIED_FAULT, parsed (fault.h).
#include "untied/train/fault.h"

#include <chrono>
#include <csignal>
#include <thread>
#include <cstdlib>
#include <sstream>

#include "untied/core/check.h"

namespace untied {
namespace {

Fault parse(const std::string& spec) {
  Fault f;
  std::stringstream ss(spec);
  std::string part;
  bool first = true;
  while (std::getline(ss, part, ':')) {
    if (first) {
      first = false;
      if (part == "nan-grad") f.kind = FaultKind::kNanGradient;
      else if (part == "nan-loss") f.kind = FaultKind::kNanLoss;
      else if (part == "nan-weight") f.kind = FaultKind::kNanWeight;
      else if (part == "kill") f.kind = FaultKind::kKill;
      else if (part == "stall") f.kind = FaultKind::kStall;
      else if (part == "exit") f.kind = FaultKind::kExit;
      else if (part == "barrier") f.kind = FaultKind::kBarrier;
      else UNTIED_CHECK(false, "UNTIED_FAULT='", spec, "': unknown fault '", part, "' (nan-grad, nan-loss, nan-weight, stall, exit, barrier, kill)");
      continue;
    }
    const size_t eq = part.find('=');
    UNTIED_CHECK(eq != std::string::npos, "UNTIED_FAULT='", spec, "': '", part, "' is not key=value");
    const std::string key = part.substr(0, eq), value = part.substr(eq + 1);
    if (key == "at") {
      f.at = value;
      continue;
    }
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    UNTIED_CHECK(end != value.c_str() && *end == '\0', "UNTIED_FAULT='", spec, "': ", key, "=", value, " is not an integer");
    if (key == "step") f.step = v;
    else if (key == "rank") f.rank = static_cast<int>(v);
    else if (key == "param") f.param = static_cast<int>(v);
    else UNTIED_CHECK(false, "UNTIED_FAULT='", spec, "': unknown key '", key, "' (step, rank, param, at)");
  }
  UNTIED_CHECK(f.kind != FaultKind::kKill || !f.at.empty(), "UNTIED_FAULT='", spec, "': kill needs at=POINT");
  UNTIED_CHECK(!(f.kind == FaultKind::kStall || f.kind == FaultKind::kBarrier) || f.at.empty() || f.at == "forward",
               "UNTIED_FAULT='", spec, "': stall and barrier take at=forward or no at");
  UNTIED_CHECK(f.kind == FaultKind::kKill || f.kind == FaultKind::kStall || f.kind == FaultKind::kBarrier ||
                   f.at.empty(), "UNTIED_FAULT='", spec, "': only kill, stall and barrier take at=");
  return f;
}

Fault from_environment() {
  const char* env = std::getenv("UNTIED_FAULT");
  return env == nullptr || *env == '\0' ? Fault{} : parse(env);
}

}  // namespace

Fault fault_from_environment(int rank) {
  Fault f = from_environment();
  if (f.rank >= 0 && f.rank != rank) return Fault{};
  return f;
}

void fault_at_step_start(const Fault& f, int64_t step, Communicator& comm) {
  if (f.step != step || !f.at.empty()) return;  // (at=forward: fault_before_forward)
  if (f.kind == FaultKind::kExit) std::_Exit(3);
  if (f.kind == FaultKind::kBarrier) comm.barrier();
  if (f.kind == FaultKind::kStall)
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void fault_before_forward(const Fault& f, int64_t step, Communicator& dev_comm) {
  if (f.step != step || f.at != "forward") return;
  if (f.kind == FaultKind::kBarrier) dev_comm.barrier();
  if (f.kind == FaultKind::kStall)
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void fault_point(const char* point, int64_t step, int rank) {
  const Fault f = fault_from_environment(rank);
  if (f.kind != FaultKind::kKill || f.at != point || (f.step >= 0 && f.step != step)) return;
  std::raise(SIGKILL);
}

}  // namespace untied

#include "cli/common_flags.h"

#include <cstdlib>

#include "cli/launch.h"

namespace untied::cli {

void add_ranks_flag(FlagSet& f, int64_t default_ranks, const std::string& help) {
  f.add("ranks", FlagKind::kInt, std::to_string(default_ranks), help);
}

void add_device_flag(FlagSet& f, const std::string& help) { f.add("device", FlagKind::kString, "cpu", help); }

void add_threads_flag(FlagSet& f, const std::string& default_text) {
  f.add("threads", FlagKind::kInt, "", "BLAS/OpenMP threads per rank, CPU only (default: " + default_text + ")");
}

void add_mem_budget_flag(FlagSet& f, const std::string& help) { f.add("mem-budget", FlagKind::kBytes, "", help); }

void add_dtype_flag(FlagSet& f, const std::string& default_dtype, const std::string& help) {
  f.add("dtype", FlagKind::kString, default_dtype, help);
}

namespace {
// A flag's text as a number; *ok is false when the whole text is not one.
double number_of(const std::string& text, bool* ok) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  *ok = end != text.c_str() && *end == '\0';
  return v;
}
}  // namespace

void add_overlap_flag(FlagSet& f) {
  f.add("overlap", FlagKind::kString, "auto",
        "upipe: the next stage's projections and all-to-alls run while this stage computes, for one more stage of "
        "buffers: on, off, or auto (on with --device cuda, off on the CPU)");
}

Status overlap_from_flags(const FlagSet& f, bool cuda, bool* overlap) {
  const std::string v = f.get_string("overlap");
  if (v != "auto" && v != "on" && v != "off")
    return Status::invalid_argument("--overlap: '" + v + "': use on, off or auto");
  *overlap = v == "on" || (v == "auto" && cuda);
  return Status::ok_status();
}

void add_watchdog_flags(FlagSet& f) {
  f.add("verify-schedule", FlagKind::kBool, "false",
        "the ranks check before each collective that they all call the same one (128 bytes each; for debugging)");
  f.add("collective-timeout", FlagKind::kString, "600",
        "seconds a collective may take before the watchdog names it on every stuck rank and aborts the job (0 = off)");
}

Status apply_watchdog_flags(const FlagSet& f) {
  const std::string v = f.get_string("collective-timeout");
  bool ok = false;
  const double seconds = number_of(v, &ok);
  if (!ok || !(seconds >= 0))
    return Status::invalid_argument("--collective-timeout: '" + v + "' is not a number of seconds >= 0");
  set_collective_timeout(seconds);
  set_verify_schedule(f.get_bool("verify-schedule"));
  return Status::ok_status();
}

Status positive_number_from_flag(const FlagSet& f, const std::string& name, double* out) {
  const std::string v = f.get_string(name);
  if (v.empty()) return Status::ok_status();
  bool ok = false;
  const double t = number_of(v, &ok);
  if (!ok || !(t > 0)) return Status::invalid_argument("--" + name + ": '" + v + "' is not a positive number");
  *out = t;
  return Status::ok_status();
}

Status rope_theta_from_flags(const FlagSet& f, double* theta) { return positive_number_from_flag(f, "rope-theta", theta); }

Status window_from_flags(const FlagSet& f, int64_t* window) {
  if (f.was_set("window") && f.get_int("window") < 1)
    return Status::invalid_argument("--window " + std::to_string(f.get_int("window")) +
                                    ": a window holds at least 1 key (the query itself); drop --window for none");
  *window = f.get_int("window");
  return Status::ok_status();
}

}  // namespace untied::cli

#include "cli/common_flags.h"

#include <cstdlib>
#include <vector>

#include "cli/launch.h"
#include "cli/rank_device.h"
#include "untied/attention/attention_block.h"

namespace untied::cli {

void add_ranks_flag(FlagSet& f, int64_t default_ranks, const std::string& help) {
  f.add_int("ranks", std::to_string(default_ranks), help, kRanksRange);
}

void add_device_flag(FlagSet& f, const std::string& help) {
  f.add_checked("device", "cpu", help, [](const std::string& v) { return parse_device_choice(v).status(); });
}

void add_threads_flag(FlagSet& f, const std::string& default_text) {
  f.add_int("threads", "", "BLAS/OpenMP threads per rank, CPU only (default: " + default_text + ")", {1, 1024});
}

int threads_from_flags(const FlagSet& f, int ranks_here) {
  return f.get_string("threads").empty() ? default_threads_per_rank(ranks_here) : static_cast<int>(f.get_int("threads"));
}

void add_mem_budget_flag(FlagSet& f, const std::string& help) { f.add("mem-budget", FlagKind::kBytes, "", help); }

void add_dtype_flag(FlagSet& f, const std::string& default_dtype, const std::string& help) {
  f.add_checked("dtype", default_dtype, help, [](const std::string& v) { return parse_dtype(v).status(); });
}

void add_strategy_flag(FlagSet& f, const std::string& help) {
  f.add_checked("strategy", "upipe", help, [](const std::string& v) { return parse_strategy(v).status(); });
}

void add_overlap_flag(FlagSet& f) {
  f.add_choice("overlap", {"on", "off", "auto"}, "auto",
               "upipe: the next stage's projections and all-to-alls run while this stage computes, for one more "
               "stage of buffers: on, off, or auto (on with --device cuda, off on the CPU)");
}

bool overlap_from_flags(const FlagSet& f, bool cuda) {
  enum class Overlap { kOn, kOff, kAuto };
  const Overlap v = f.get_choice("overlap", std::vector{Overlap::kOn, Overlap::kOff, Overlap::kAuto});
  return v == Overlap::kOn || (v == Overlap::kAuto && cuda);
}

void add_watchdog_flags(FlagSet& f) {
  f.add("verify-schedule", FlagKind::kBool, "false",
        "the ranks check before each collective that they all call the same one (128 bytes each; for debugging)");
  f.add_number("collective-timeout", "600",
               "seconds a collective may take before the watchdog names it on every stuck rank and aborts the job "
               "(0 = off)",
               NumberBound{.min = 0, .strict = false, .what = "a number of seconds >= 0"});
}

void apply_watchdog_flags(const FlagSet& f) {
  set_collective_timeout(f.get_number("collective-timeout"));
  set_verify_schedule(f.get_bool("verify-schedule"));
}

void add_rope_theta_flag(FlagSet& f, const std::string& default_value, const std::string& help) {
  f.add_number("rope-theta", default_value, help, positive_number());
}

void rope_theta_from_flags(const FlagSet& f, double* theta) {
  if (!f.get_string("rope-theta").empty()) *theta = f.get_number("rope-theta");
}

Status window_from_flags(const FlagSet& f, int64_t* window) {
  if (f.was_set("window") && f.get_int("window") < 1)
    return Status::invalid_argument("--window " + std::to_string(f.get_int("window")) +
                                    ": a window holds at least 1 key (the query itself); drop --window for none");
  *window = f.get_int("window");
  return Status::ok_status();
}

}  // namespace untied::cli

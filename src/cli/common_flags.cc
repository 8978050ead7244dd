#include "cli/common_flags.h"

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

}  // namespace untied::cli

// Fuzz target: a command line (arguments separated by NUL bytes) parsed by the flag parser with
// flags of every kind.
#include <string>
#include <vector>

#include "cli/args.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) args.emplace_back();
    else args.back().push_back(static_cast<char>(data[i]));
  }
  untied::cli::FlagSet f("fuzz", "");
  f.add("seq", untied::cli::FlagKind::kInt, "256", "");
  f.add("mem-budget", untied::cli::FlagKind::kBytes, "", "");
  f.add("name", untied::cli::FlagKind::kString, "", "");
  f.add("flag", untied::cli::FlagKind::kBool, "false", "");
  if (f.parse(args).ok()) {
    (void)f.get_int("seq");
    (void)f.get_bytes("mem-budget");
    (void)f.get_bool("flag");
    (void)f.usage();
  }
  return 0;
}

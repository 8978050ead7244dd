// Fuzz target: a train --config file (`name = value` lines or a JSON object) read into flag
// arguments, which the flag parser then takes.
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  if (!untied::cli::parse_config("config", std::string(reinterpret_cast<const char*>(data), size), &args).ok()) return 0;
  untied::cli::FlagSet f("fuzz", "");
  f.add("seq", untied::cli::FlagKind::kInt, "256", "");
  f.add("lr", untied::cli::FlagKind::kString, "0.003", "");
  f.add("progress", untied::cli::FlagKind::kBool, "true", "");
  (void)f.parse(args);
  return 0;
}

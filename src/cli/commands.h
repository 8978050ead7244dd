// Entry points of the subcommands. Each parses its own flags from `args` and returns the
// process exit code (0 ok, 1 runtime error, 2 bad usage).
#pragma once

#include <string>
#include <vector>

namespace untied::cli {

int bench_kernels_main(int* argc, char*** argv, const std::vector<std::string>& args);
int bench_attn_main(int* argc, char*** argv, const std::vector<std::string>& args);
int train_main(int* argc, char*** argv, const std::vector<std::string>& args);
int plan_main(int* argc, char*** argv, const std::vector<std::string>& args);
int attn_main(int* argc, char*** argv, const std::vector<std::string>& args);
int prepare_main(int* argc, char*** argv, const std::vector<std::string>& args);
int eval_main(int* argc, char*** argv, const std::vector<std::string>& args);
int export_main(int* argc, char*** argv, const std::vector<std::string>& args);
int ranks_main(int* argc, char*** argv, const std::vector<std::string>& args);

}  // namespace untied::cli

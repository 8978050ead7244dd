// The `untied` command: dispatches to subcommands. No model logic lives here.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace {

const char* kUsage =
    "untied: long-context Transformer training with context parallelism (UPipe, Ulysses)\n"
    "\n"
    "usage: untied <command> [flags]        (multi-rank: mpirun -np N untied <command> ...)\n"
    "\n"
    "commands:\n"
    "  bench kernels   benchmark the CPU kernels (flash attention forward/backward, GEMM)\n"
    "\n"
    "Run `untied <command> --help` for the flags of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (cmd == "--version") {
    std::printf("untied 0.1.0\n");
    return 0;
  }
  if (cmd == "bench") {
    if (argc < 3 || std::strcmp(argv[2], "kernels") != 0) {
      if (argc >= 3 && (std::strcmp(argv[2], "--help") == 0 || std::strcmp(argv[2], "-h") == 0)) {
        std::printf("usage: untied bench kernels [flags]\n");
        return 0;
      }
      std::fprintf(stderr, "untied bench: unknown benchmark '%s'; available: kernels\n",
                   argc >= 3 ? argv[2] : "");
      return 2;
    }
    std::vector<std::string> args(argv + 3, argv + argc);
    return untied::cli::bench_kernels_main(&argc, &argv, args);
  }
  std::fprintf(stderr, "untied: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
  return 2;
}

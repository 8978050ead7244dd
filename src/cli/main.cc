// The `untied` command: dispatches to subcommands. No model logic lives here.
#include <csignal>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "untied/kernels/cpu_kernels_info.h"

namespace {

const char* kUsage =
    "untied: long-context Transformer training with context parallelism (UPipe, Ulysses)\n"
    "\n"
    "usage: untied <command> [flags]        (multi-rank: mpirun -np N untied <command> ...; GPU ranks\n"
    "                                        also srun or torchrun without MPI: docs/training.md#launchers)\n"
    "\n"
    "commands:\n"
    "  train           train a decoder with context parallelism (main job; built-in kv task)\n"
    "  plan            a training step's memory per rank from closed forms; --fit: the longest S that fits\n"
    "  eval            a model's loss, perplexity and loss by position on a token file\n"
    "  export          an untied checkpoint as a Hugging Face model directory\n"
    "  attn            one attention block forward+backward (local, ulysses, upipe, ring): time, memory\n"
    "  bench kernels   benchmark the kernels (flash attention forward/backward, GEMM)\n"
    "  bench attn      Ulysses vs UPipe for real head shapes: time and attention-layer memory\n"
    "  prepare         text or JSONL -> a token file, with a Hugging Face tokenizer.json (Llama 3, Qwen)\n"
    "  ranks           check a launch (mpirun, srun, torchrun): each rank's host, local rank, GPU, NCCL id\n"
    "\n"
    "train, eval, attn and bench take --device cpu|cuda (CPU by default); train and plan take --config FILE.\n"
    "\n"
    "Run `untied <command> --help` for the flags of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  // A file size limit (RLIMIT_FSIZE) then fails the write with EFBIG, which is reported like a
  // full disk, instead of killing the process in the middle of a checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  // Before anything starts a thread or uses BLAS: may restart the program with better kernels.
  untied::choose_cpu_kernels(argv);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (cmd == "--version") {
    std::printf("untied 0.1.0\n");
    return 0;
  }
  if (cmd == "train") {
    std::vector<std::string> args(argv + 2, argv + argc);
    return untied::cli::train_main(&argc, &argv, args);
  }
  if (cmd == "plan") {
    std::vector<std::string> args(argv + 2, argv + argc);
    return untied::cli::plan_main(&argc, &argv, args);
  }
  if (cmd == "eval") {
    std::vector<std::string> args(argv + 2, argv + argc);
    return untied::cli::eval_main(&argc, &argv, args);
  }
  if (cmd == "export") {
    std::vector<std::string> args(argv + 2, argv + argc);
    return untied::cli::export_main(&argc, &argv, args);
  }
  if (cmd == "attn") {
    std::vector<std::string> args(argv + 2, argv + argc);
    return untied::cli::attn_main(&argc, &argv, args);
  }
  if (cmd == "ranks") return untied::cli::ranks_main(&argc, &argv, std::vector<std::string>(argv + 2, argv + argc));
  if (cmd == "prepare") return untied::cli::prepare_main(&argc, &argv, std::vector<std::string>(argv + 2, argv + argc));
  if (cmd == "bench") {
    const std::string which = argc >= 3 ? argv[2] : "";
    std::vector<std::string> args(argv + std::min(argc, 3), argv + argc);
    if (which == "kernels") return untied::cli::bench_kernels_main(&argc, &argv, args);
    if (which == "attn") return untied::cli::bench_attn_main(&argc, &argv, args);
    if (which == "--help" || which == "-h") {
      std::printf("usage: untied bench kernels|attn [flags]   (see `untied bench kernels --help`)\n");
      return 0;
    }
    std::fprintf(stderr, "untied bench: unknown benchmark '%s'; available: kernels, attn\n", which.c_str());
    return 2;
  }
  std::fprintf(stderr, "untied: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
  return 2;
}

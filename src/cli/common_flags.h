// The flags that several subcommands share (train, attn, bench kernels, bench attn), declared
// once: --ranks, --device, --threads, --mem-budget and --dtype have the same name, kind and
// wording wherever they appear. Each is added by its own function, so that a command places it
// where it belongs in its --help; where commands differ in a default or in what the help says
// (bench attn runs 8 ranks by default, bench kernels has no in-process ranks, ...), that is a
// parameter, and the command that differs passes it.
#pragma once

#include <cstdint>
#include <string>

#include "cli/args.h"
#include "untied/core/status.h"

namespace untied::cli {

inline constexpr const char* kRanksHelp = "in-process ranks when not launched by mpirun";
inline constexpr const char* kDeviceHelp =
    "cpu or cuda (in-process ranks share GPU 0; under mpirun one GPU per rank, NCCL)";
inline constexpr const char* kMemBudgetHelp = "per-rank memory budget, e.g. 2G (default: none)";
inline constexpr const char* kDtypeHelp = "storage type: f32 or bf16";

// In-process ranks a command may start (--ranks).
inline constexpr IntRange kRanksRange{1, 1024};

// --ranks N (int in kRanksRange): in-process ranks when not launched by mpirun.
void add_ranks_flag(FlagSet& f, int64_t default_ranks, const std::string& help = kRanksHelp);

// --device cpu|cuda (checked by parse_device_choice, default cpu); read it with
// parse_device_choice (rank_device.h).
void add_device_flag(FlagSet& f, const std::string& help = kDeviceHelp);

// --threads N (int in [1, 1024], empty default): BLAS/OpenMP threads per rank on the CPU;
// `default_text` says what the command uses when it is not given.
void add_threads_flag(FlagSet& f, const std::string& default_text = "cores / ranks");
// --threads, or default_threads_per_rank (launch.h) for `ranks_here` ranks on this host.
int threads_from_flags(const FlagSet& f, int ranks_here);

// --mem-budget BYTES (bytes, empty default = none): the per-rank memory budget.
void add_mem_budget_flag(FlagSet& f, const std::string& help = kMemBudgetHelp);

// --dtype f32|bf16 (checked by parse_dtype); read it with parse_dtype. An empty default_dtype: the
// command chooses one by device (its help says which).
void add_dtype_flag(FlagSet& f, const std::string& default_dtype, const std::string& help = kDtypeHelp);

// --strategy local|ulysses|upipe|ring (checked by parse_strategy, default upipe).
void add_strategy_flag(FlagSet& f, const std::string& help);

// --overlap on|off|auto (a choice, default auto): UPipe runs stage s+1's projections and
// all-to-alls while stage s computes (AttentionConfig::overlap), for one more stage of exchange
// buffers. auto is on for --device cuda (NCCL moves the bytes on its own stream while kernels
// run) and off on the CPU (the cores that compute also move the bytes; docs/training.md).
void add_overlap_flag(FlagSet& f);
// --overlap on the device the command runs on.
bool overlap_from_flags(const FlagSet& f, bool cuda);

// --verify-schedule and --collective-timeout (a number of seconds >= 0: the watchdog,
// untied/comm/watchdog.h), and, after parsing, their values handed to run_ranks (launch.h).
void add_watchdog_flags(FlagSet& f);
void apply_watchdog_flags(const FlagSet& f);
// --rope-theta (a positive number; an empty default = the model's).
void add_rope_theta_flag(FlagSet& f, const std::string& default_value, const std::string& help);
// *theta = --rope-theta when it has a value.
void rope_theta_from_flags(const FlagSet& f, double* theta);
// --window (an int flag, 0 = none): *window = its value; a given value below 1 is refused.
Status window_from_flags(const FlagSet& f, int64_t* window);

}  // namespace untied::cli

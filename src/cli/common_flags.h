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

// --ranks N (int): in-process ranks when not launched by mpirun.
void add_ranks_flag(FlagSet& f, int64_t default_ranks, const std::string& help = kRanksHelp);

// --device cpu|cuda (string, default cpu); read it with parse_device_choice (rank_device.h).
void add_device_flag(FlagSet& f, const std::string& help = kDeviceHelp);

// --threads N (int, empty default): BLAS/OpenMP threads per rank on the CPU; `default_text` says
// what the command uses when it is not given (default_threads_per_rank in launch.h).
void add_threads_flag(FlagSet& f, const std::string& default_text = "cores / ranks");

// --mem-budget BYTES (bytes, empty default = none): the per-rank memory budget.
void add_mem_budget_flag(FlagSet& f, const std::string& help = kMemBudgetHelp);

// --dtype f32|bf16 (string); read it with parse_dtype. An empty default_dtype: the command
// chooses one by device (its help says which).
void add_dtype_flag(FlagSet& f, const std::string& default_dtype, const std::string& help = kDtypeHelp);

// --overlap auto|on|off (string, default auto): UPipe runs stage s+1's projections and
// all-to-alls while stage s computes (AttentionConfig::overlap), for one more stage of exchange
// buffers. auto is on for --device cuda (NCCL moves the bytes on its own stream while kernels
// run) and off on the CPU (the cores that compute also move the bytes; see the README).
void add_overlap_flag(FlagSet& f);
// *overlap from --overlap on the device the command runs on; a bad value is refused.
Status overlap_from_flags(const FlagSet& f, bool cuda, bool* overlap);

// --verify-schedule and --collective-timeout (the watchdog, untied/comm/watchdog.h), and, after
// parsing, their values handed to run_ranks (launch.h); the message names a bad timeout.
void add_watchdog_flags(FlagSet& f);
Status apply_watchdog_flags(const FlagSet& f);
// --rope-theta (a string flag, empty = the model's): *theta = its value when given; a value that
// is not a positive number is refused.
Status rope_theta_from_flags(const FlagSet& f, double* theta);
// A string flag holding a number > 0 into *out; an empty one leaves *out as it is. The message
// names the flag and its text.
Status positive_number_from_flag(const FlagSet& f, const std::string& name, double* out);
// --window (an int flag, 0 = none): *window = its value; a given value below 1 is refused.
Status window_from_flags(const FlagSet& f, int64_t* window);

}  // namespace untied::cli

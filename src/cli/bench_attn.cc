// `untied bench attn`: Ulysses against UPipe at U = C, 2C, 4C for the Llama3-8B and Qwen3-32B
// head shapes: forward+backward time and the attention layer's memory measured by the
// allocator, next to the paper's formulas. Timed rows run the real code; rows at lengths too
// long to compute here run in rehearsal (every allocation of the real schedule counted, compute
// skipped), which gives the exact peaks.
//
// --fit: for each strategy, the longest sequence whose rehearsal peak per rank fits in a memory
// target (on a GPU: its free memory shared by the ranks on it, less a headroom), then a timed
// run of every strategy at one length they all fit (capped by --fit-run-max), so that times
// compare at equal S.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>

#include "cli/args.h"
#include "cli/attn_runner.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/rank_device.h"

namespace untied::cli {

namespace {

struct BenchRow {
  std::string preset, strategy, mode;
  int64_t U = 0, seq = 0;
  AttnRunResult r;
  int64_t paper = 0, exact = 0;
};

struct Spec {
  Strategy strategy;
  int64_t upipe_heads;  // 0 for ulysses
};

// One strategy's answer under --fit.
struct FitRow {
  std::string preset, strategy;
  Spec spec{Strategy::kUlysses, 0};
  int64_t U = 0;
  int64_t max_seq = 0;      // longest S whose rehearsal peak per rank fits (0: not even one step)
  int64_t peak_at_max = 0;  // that rehearsal's peak per rank
  int64_t run_seq = 0;      // S of the timed run (0: none)
  AttnRunResult run;
};

AttentionConfig make_config(const std::string& preset, DType dtype, Spec spec, int64_t seq) {
  AttentionConfig cfg;
  cfg.seq = seq;
  cfg.dtype = dtype;
  cfg.strategy = spec.strategy;
  cfg.upipe_heads = spec.upipe_heads;
  apply_heads_preset(preset, &cfg);
  return cfg;
}

std::string bytes_or_dash(int64_t b) { return b > 0 ? format_bytes(b) : "-"; }

std::string ms_or_dash(bool ran, double ms) {
  if (!ran) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ms);
  return buf;
}

}  // namespace

int bench_attn_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied bench attn",
                "Ulysses vs UPipe (U = C, 2C, 4C) for real head shapes: time and attention-layer memory per rank.\n"
                "With --fit: the longest sequence each strategy fits per rank, and times at one length all fit.");
  flags.add("presets", FlagKind::kString, "llama3-8b,qwen3-32b", "head presets (comma separated)");
  flags.add("seqs", FlagKind::kIntList, "4K", "sequence lengths that are run and timed");
  flags.add("mem-seqs", FlagKind::kIntList, "128K,1M,3M", "sequence lengths measured in rehearsal (memory only)");
  flags.add("multiples", FlagKind::kIntList, "1,2,4", "UPipe stage sizes U as multiples of the ranks C");
  flags.add("dtype", FlagKind::kString, "bf16", "storage type: f32 or bf16");
  flags.add("ranks", FlagKind::kInt, "8", "in-process ranks when not launched by mpirun");
  flags.add("device", FlagKind::kString, "cpu",
            "cpu or cuda (in-process ranks share GPU 0; under mpirun one GPU per rank, NCCL). Rehearsal rows "
            "are counted on the CPU as GPU ranks");
  flags.add("threads", FlagKind::kInt, "", "BLAS/OpenMP threads per rank, CPU only (default: cores / ranks, at least 1)");
  flags.add("warmup", FlagKind::kInt, "1", "untimed forward+backward passes before each timed one");
  flags.add("mem-budget", FlagKind::kBytes, "",
            "per-rank memory budget of the timed runs; with --fit also the memory to fit in (default: none; "
            "--fit on a GPU: its free memory / ranks on it, less --fit-headroom)");
  flags.add("fit", FlagKind::kBool, "false",
            "instead of --seqs and --mem-seqs: find each strategy's longest sequence that fits per rank "
            "(rehearsal), then time all at one length they all fit");
  flags.add("fit-step", FlagKind::kInt, "8K", "--fit: sequence lengths are multiples of this (and of the ranks)");
  flags.add("fit-max", FlagKind::kInt, "64M", "--fit: longest sequence tried");
  flags.add("fit-run-max", FlagKind::kInt, "256K",
            "--fit: the timed runs use the longest length every strategy fits, at most this (the default "
            "keeps 8 in-process ranks on one H200 to a few minutes)");
  flags.add("fit-headroom", FlagKind::kInt, "20",
            "--fit on a GPU without --mem-budget: percent of each rank's share of free memory kept for the CUDA "
            "context, cuBLAS workspaces and the caching allocator's unused blocks");
  flags.add("json", FlagKind::kBool, "false", "print a JSON array instead of the table");
  const LaunchInfo li = launch_info();
  Status st = flags.parse(args);
  std::vector<std::string> presets;
  if (st.ok()) {
    std::string p = flags.get_string("presets"), item;
    for (size_t i = 0; i <= p.size(); ++i) {
      if (i == p.size() || p[i] == ',') {
        AttentionConfig probe;
        Status ps = apply_heads_preset(item, &probe);
        if (!ps.ok() && st.ok()) st = Status::invalid_argument("--presets: " + ps.message());
        presets.push_back(item);
        item.clear();
      } else {
        item += p[i];
      }
    }
  }
  auto dt = parse_dtype(st.ok() ? flags.get_string("dtype") : "f32");
  if (st.ok() && !dt.ok()) st = Status::invalid_argument("--dtype: " + dt.status().message());
  auto device = parse_device_choice(st.ok() ? flags.get_string("device") : "cpu");
  if (st.ok() && !device.ok()) st = Status::invalid_argument("--device: " + device.status().message());
  const int ranks = li.mpi ? -1 : (st.ok() ? static_cast<int>(flags.get_int("ranks")) : 1);
  if (st.ok() && !li.mpi && (ranks < 1 || ranks > 1024)) st = Status::invalid_argument("--ranks must be in [1, 1024]");
  if (st.ok() && flags.get_int("warmup") < 0) st = Status::invalid_argument("--warmup must be >= 0");
  const bool fit = st.ok() && flags.get_bool("fit");
  if (fit) {
    const int64_t step = flags.get_int("fit-step");
    if (step < 1) st = Status::invalid_argument("--fit-step must be >= 1");
    else if (!li.mpi && step % ranks != 0)
      st = Status::invalid_argument("--fit-step " + std::to_string(step) + " must be a multiple of the ranks (" +
                                    std::to_string(ranks) + ")");
    else if (flags.get_int("fit-max") < step || flags.get_int("fit-run-max") < step)
      st = Status::invalid_argument("--fit-max and --fit-run-max must be at least --fit-step");
    else if (flags.get_int("fit-headroom") < 0 || flags.get_int("fit-headroom") >= 100)
      st = Status::invalid_argument("--fit-headroom is a percent in [0, 100)");
    else if (device.value() == DeviceChoice::kCpu && flags.get_bytes("mem-budget") == 0)
      st = Status::invalid_argument("--fit on the CPU needs --mem-budget: the memory per rank to fit in");
  }
  if (!st.ok() || flags.wants_help()) {
    if (li.world_rank == 0)
      std::fprintf(st.ok() ? stdout : stderr, "%s\n", st.ok() ? flags.usage().c_str() : ("untied bench attn: " + st.message()).c_str());
    return st.ok() ? 0 : 2;
  }
  const int threads = flags.get_string("threads").empty()
                          ? default_threads_per_rank(li.mpi ? local_ranks_under_mpirun() : ranks)
                          : static_cast<int>(flags.get_int("threads"));
  const DeviceChoice dev_choice = device.value();
  const bool gpu = dev_choice == DeviceChoice::kCuda;
  const int64_t budget = flags.get_bytes("mem-budget");
  const int warmup = static_cast<int>(flags.get_int("warmup"));

  return run_ranks(argc, argv, li.mpi ? 1 : ranks, [&](Communicator& world) {
    const int C = world.size();
    // GPU refusals (none visible, a build without CUDA, a budget over the free memory) before
    // any rehearsal or run; and where the timed rows will run, for the header.
    std::string where = std::to_string(C) + " ranks (" + world.backend() + ") x " + std::to_string(threads) +
                        " thread" + (threads == 1 ? "" : "s");
    if (gpu) {
      RankDevice probe = make_rank_device(world, RankDeviceOptions{.device = dev_choice, .budget_bytes = budget});
      where = std::to_string(C) + " ranks (" + probe.comm().backend() + ") on " + probe.dev().name();
    }
    std::vector<Spec> specs = {{Strategy::kUlysses, 0}};
    for (int64_t m : flags.get_int_list("multiples")) specs.push_back({Strategy::kUPipe, m * C});

    if (fit) {
      // The memory each rank may use.
      int64_t target = budget, free_bytes = 0;
      const int headroom = static_cast<int>(flags.get_int("fit-headroom"));
      if (target == 0) {
        free_bytes = agreed_gpu_free_bytes(world);
        target = free_bytes / ranks_per_gpu(world) / 100 * (100 - headroom);
      }
      check_all_ranks(world, flags.get_int("fit-step") % C == 0
                                 ? Status::ok_status()
                                 : Status::invalid_argument("--fit-step must be a multiple of the ranks (" +
                                                            std::to_string(C) + ")"));
      const int64_t step = flags.get_int("fit-step"), fit_max = flags.get_int("fit-max") / step * step;
      std::vector<FitRow> rows;
      for (const std::string& preset : presets) {
        const size_t first = rows.size();
        for (Spec spec : specs) {
          if (!validate(make_config(preset, dt.value(), spec, step), C).ok()) continue;  // e.g. U > H
          FitRow row;
          row.preset = preset;
          row.strategy = std::string(strategy_name(spec.strategy));
          row.spec = spec;
          // Rehearsal peak per rank at S, max over ranks: every rank gets the same answers and
          // takes the same path through the search.
          std::map<int64_t, int64_t> peak;
          auto fits = [&](int64_t S) {
            const AttentionConfig cfg = make_config(preset, dt.value(), spec, S);
            if (!validate(cfg, C).ok()) return false;
            AttnRunOptions o;
            o.device = dev_choice;
            o.threads = threads;
            o.rehearsal = true;
            const AttnRunResult r = run_attention(world, cfg, o);
            row.U = r.stage_heads;
            peak[S] = r.mem.peak_total;
            return r.mem.peak_total <= target;
          };
          // Double from one step while it fits, then bisect in steps between the last length
          // that fits (lo) and the first that does not, or one step past --fit-max (hi).
          if (fits(step)) {
            int64_t lo = step, hi = 2 * step;
            while (hi <= fit_max && fits(hi)) lo = hi, hi *= 2;
            hi = std::min(hi, fit_max + step);
            while (hi - lo > step) {
              const int64_t mid = lo + (hi - lo) / step / 2 * step;
              if (fits(mid)) lo = mid;
              else hi = mid;
            }
            row.max_seq = lo;
            row.peak_at_max = peak[lo];
          }
          rows.push_back(row);
        }
        // Timed runs at one length that every strategy of this preset fits.
        int64_t run_seq = flags.get_int("fit-run-max") / step * step;
        for (size_t i = first; i < rows.size(); ++i) run_seq = std::min(run_seq, rows[i].max_seq);
        if (run_seq <= 0) continue;
        for (size_t i = first; i < rows.size(); ++i) {
          FitRow& row = rows[i];
          AttnRunOptions o;
          o.device = dev_choice;
          o.threads = threads;
          o.budget_bytes = budget;
          o.warmup = warmup;
          row.run = run_attention(world, make_config(preset, dt.value(), row.spec, run_seq), o);
          row.run_seq = run_seq;
        }
      }
      if (world.rank() != 0) return;
      if (flags.get_bool("json")) {
        std::printf("[\n");
        for (size_t i = 0; i < rows.size(); ++i) {
          const FitRow& r = rows[i];
          std::printf("  {\"preset\": \"%s\", \"strategy\": \"%s\", \"upipe_heads\": %lld, \"ranks\": %d, "
                      "\"fit_target_bytes\": %lld, \"max_seq\": %lld, \"peak_bytes_at_max_seq\": %lld, "
                      "\"run_seq\": %lld, \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"peak_bytes\": %lld, "
                      "\"attn_intermediate_bytes_fwd\": %lld, \"attn_intermediate_bytes_bwd\": %lld, "
                      "\"gpu_reserved_bytes\": %lld, \"peak_bytes_by_tag\": %s, \"device\": \"%s\"}%s\n",
                      r.preset.c_str(), r.strategy.c_str(), (long long)r.U, C, (long long)target,
                      (long long)r.max_seq, (long long)r.peak_at_max, (long long)r.run_seq, r.run.fwd_ms,
                      r.run.bwd_ms, (long long)r.run.mem.peak_total, (long long)r.run.intermediates_fwd,
                      (long long)r.run.intermediates_bwd, (long long)r.run.reserved_peak,
                      memory_json(r.run.mem).c_str(), r.run.device_name.c_str(), i + 1 < rows.size() ? "," : "");
        }
        std::printf("]\n");
        return;
      }
      std::string target_text = format_bytes(target) + " per rank";
      if (free_bytes > 0)
        target_text += " (" + format_bytes(free_bytes) + " free / " + std::to_string(ranks_per_gpu(world)) +
                       " rank" + (ranks_per_gpu(world) == 1 ? "" : "s") + " per GPU, less " + std::to_string(headroom) +
                       "%)";
      else
        target_text += " (--mem-budget)";
      std::printf("untied bench attn --fit | %s | %s storage | memory to fit in: %s\n", where.c_str(),
                  std::string(dtype_name(dt.value())).c_str(), target_text.c_str());
      std::printf("%-10s %-8s %4s %9s %12s | %8s %10s %10s %6s %12s %12s %12s%s\n", "preset", "strategy", "U",
                  "max_seq", "peak@max", "run_seq", "fwd_ms", "bwd_ms", "t/uly", "peak_run", "inter_fwd", "inter_bwd",
                  gpu ? "  gpu_reserved" : "");
      std::map<std::string, const FitRow*> base;
      for (const FitRow& r : rows)
        if (r.strategy == "ulysses") base[r.preset] = &r;
      for (const FitRow& r : rows) {
        const FitRow* b = base[r.preset];
        const bool ran = r.run_seq > 0;
        char tr[16] = "-";
        if (ran && b && b->run_seq > 0)
          std::snprintf(tr, sizeof tr, "%.3f", (r.run.fwd_ms + r.run.bwd_ms) / (b->run.fwd_ms + b->run.bwd_ms));
        const std::string reserved = gpu ? "  " + (ran ? format_bytes(r.run.reserved_peak) : std::string("-")) : "";
        std::printf("%-10s %-8s %4lld %9lld %12s | %8s %10s %10s %6s %12s %12s %12s%s\n", r.preset.c_str(),
                    r.strategy.c_str(), (long long)r.U, (long long)r.max_seq, bytes_or_dash(r.peak_at_max).c_str(),
                    ran ? std::to_string(r.run_seq).c_str() : "-", ms_or_dash(ran, r.run.fwd_ms).c_str(),
                    ms_or_dash(ran, r.run.bwd_ms).c_str(), tr, ran ? format_bytes(r.run.mem.peak_total).c_str() : "-",
                    ran ? format_bytes(r.run.intermediates_fwd).c_str() : "-",
                    ran ? format_bytes(r.run.intermediates_bwd).c_str() : "-", reserved.c_str());
      }
      std::printf("max_seq: longest multiple of %lld tokens whose rehearsal peak per rank (peak@max) fits in the\n"
                  "memory above%s; run_seq: the length every strategy of the preset fits, at most --fit-run-max,\n"
                  "where all are timed (forward+backward, slowest rank; t/uly relative to Ulysses); peak_run: the\n"
                  "measured peak per rank of that run%s.\n",
                  (long long)step, gpu ? " (rehearsal counted as GPU ranks, one kernel thread each)" : "",
                  gpu ? "; gpu_reserved: the most its caching allocator held from cudaMalloc\n(cached blocks "
                        "of other sizes included), the footprint the headroom is for"
                      : "");
      if (gpu && ranks_per_gpu(world) > 1)
        std::printf("%d in-process ranks share one GPU, each on its own stream: times are those of all ranks' work "
                    "on one GPU.\n", C);
      return;
    }

    std::vector<BenchRow> rows;
    for (const std::string& preset : presets) {
      for (bool rehearsal : {false, true}) {
        for (int64_t S : flags.get_int_list(rehearsal ? "mem-seqs" : "seqs")) {
          for (Spec spec : specs) {
            AttentionConfig cfg = make_config(preset, dt.value(), spec, S);
            if (!validate(cfg, C).ok()) continue;  // e.g. U = 4C > H: not a valid stage size
            BenchRow row{preset, std::string(strategy_name(spec.strategy)), rehearsal ? "rehearsal" : "run", 0, S, {}, 0, 0};
            AttnRunOptions o;
            o.device = dev_choice;
            o.threads = threads;
            o.rehearsal = rehearsal;
            o.warmup = warmup;
            if (!rehearsal) o.budget_bytes = budget;
            row.r = run_attention(world, cfg, o);
            row.U = row.r.stage_heads;
            row.paper = paper_mha_bytes(cfg, C, row.U);
            row.exact = gqa_exact_bytes(cfg, C, row.U);
            rows.push_back(row);
          }
        }
      }
    }
    if (world.rank() != 0) return;
    // Ratios against the Ulysses row of the same preset, length and mode.
    std::map<std::string, const BenchRow*> base;
    for (const BenchRow& r : rows)
      if (r.strategy == "ulysses") base[r.preset + "/" + std::to_string(r.seq) + "/" + r.mode] = &r;
    if (flags.get_bool("json")) {
      std::printf("[\n");
      for (size_t i = 0; i < rows.size(); ++i) {
        const BenchRow& r = rows[i];
        std::printf("  {\"preset\": \"%s\", \"strategy\": \"%s\", \"upipe_heads\": %lld, \"ranks\": %d, \"seq\": %lld, "
                    "\"mode\": \"%s\", \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"attn_intermediate_bytes_fwd\": %lld, "
                    "\"attn_intermediate_bytes_bwd\": %lld, \"peak_bytes\": %lld, \"peak_bytes_by_tag\": %s, "
                    "\"paper_mha_formula_bytes\": %lld, \"gqa_exact_formula_bytes\": %lld, \"device\": \"%s\"}%s\n",
                    r.preset.c_str(), r.strategy.c_str(), (long long)r.U, C, (long long)r.seq, r.mode.c_str(),
                    r.r.fwd_ms, r.r.bwd_ms, (long long)r.r.intermediates_fwd, (long long)r.r.intermediates_bwd,
                    (long long)r.r.mem.peak_total, memory_json(r.r.mem).c_str(), (long long)r.paper, (long long)r.exact,
                    r.r.device_name.c_str(), i + 1 < rows.size() ? "," : "");
      }
      std::printf("]\n");
      return;
    }
    std::printf("untied bench attn | %s | %s storage | per-rank figures, max over ranks\n", where.c_str(),
                std::string(dtype_name(dt.value())).c_str());
    std::printf("%-10s %-8s %4s %8s %-9s %10s %10s %6s %12s %12s %7s %12s %12s %12s\n", "preset", "strategy", "U", "seq",
                "mode", "fwd_ms", "bwd_ms", "t/uly", "inter_fwd", "inter_bwd", "m/uly", "peak", "formula_mha",
                "formula_gqa");
    for (const BenchRow& r : rows) {
      const BenchRow* b = base[r.preset + "/" + std::to_string(r.seq) + "/" + r.mode];
      char tr[16] = "-", mr[16] = "-";
      if (b && r.mode == "run") std::snprintf(tr, sizeof tr, "%.3f", (r.r.fwd_ms + r.r.bwd_ms) / (b->r.fwd_ms + b->r.bwd_ms));
      if (b) std::snprintf(mr, sizeof mr, "%.3f", double(r.r.intermediates_fwd) / double(b->r.intermediates_fwd));
      std::printf("%-10s %-8s %4lld %8lld %-9s %10s %10s %6s %12s %12s %7s %12s %12s %12s\n", r.preset.c_str(),
                  r.strategy.c_str(), (long long)r.U, (long long)r.seq, r.mode.c_str(),
                  r.mode == "run" ? std::to_string(r.r.fwd_ms).substr(0, 9).c_str() : "-",
                  r.mode == "run" ? std::to_string(r.r.bwd_ms).substr(0, 9).c_str() : "-", tr,
                  format_bytes(r.r.intermediates_fwd).c_str(), format_bytes(r.r.intermediates_bwd).c_str(), mr,
                  format_bytes(r.r.mem.peak_total).c_str(), format_bytes(r.paper).c_str(), format_bytes(r.exact).c_str());
    }
    std::printf("inter_fwd/inter_bwd: peak of attention workspace + communication buffers live together in forward /\n"
                "backward; m/uly: forward intermediates relative to Ulysses; t/uly: forward+backward time relative to\n"
                "Ulysses; peak: all bytes of the rank at its peak (weights, gradients, inputs, outputs included);\n"
                "formula_mha: 12*L*U*D bytes (bf16) as in the paper (K/V counted with U heads);\n"
                "formula_gqa: exact q/k/v projections + receive buffers at the first stage of a KV round.\n");
    if (gpu)
      std::printf("run rows on %s%s; rehearsal rows counted on the CPU as GPU ranks (one kernel thread each).\n",
                  where.c_str(), ranks_per_gpu(world) > 1 ? ", one GPU shared by all ranks (each on its own stream)" : "");
  });
}

}  // namespace untied::cli

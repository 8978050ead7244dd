// `untied bench attn`: Ulysses against UPipe at U = C, 2C, 4C for the Llama3-8B and Qwen3-32B
// head shapes: forward+backward time and the attention layer's intermediate memory measured by
// the allocator, next to the paper's formulas. Timed rows run the real code; rows at lengths
// too long to compute here run in rehearsal (every allocation of the real schedule counted,
// compute skipped), which gives the exact peaks.
#include <cstdio>
#include <map>

#include "cli/args.h"
#include "cli/attn_runner.h"
#include "cli/commands.h"
#include "cli/launch.h"

namespace untied::cli {

namespace {

struct BenchRow {
  std::string preset, strategy, mode;
  int64_t U = 0, seq = 0;
  AttnRunResult r;
  int64_t paper = 0, exact = 0;
};

}  // namespace

int bench_attn_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied bench attn",
                "Ulysses vs UPipe (U = C, 2C, 4C) for real head shapes: time and attention-layer memory per rank.");
  flags.add("presets", FlagKind::kString, "llama3-8b,qwen3-32b", "head presets (comma separated)");
  flags.add("seqs", FlagKind::kIntList, "4K", "sequence lengths that are run and timed");
  flags.add("mem-seqs", FlagKind::kIntList, "128K,1M,3M", "sequence lengths measured in rehearsal (memory only)");
  flags.add("multiples", FlagKind::kIntList, "1,2,4", "UPipe stage sizes U as multiples of the ranks C");
  flags.add("dtype", FlagKind::kString, "bf16", "storage type: f32 or bf16");
  flags.add("ranks", FlagKind::kInt, "8", "in-process ranks when not launched by mpirun");
  flags.add("threads", FlagKind::kInt, "", "BLAS/OpenMP threads per rank (default: cores / ranks, at least 1)");
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
  const int ranks = li.mpi ? -1 : (st.ok() ? static_cast<int>(flags.get_int("ranks")) : 1);
  if (st.ok() && !li.mpi && (ranks < 1 || ranks > 1024)) st = Status::invalid_argument("--ranks must be in [1, 1024]");
  if (!st.ok() || flags.wants_help()) {
    if (li.world_rank == 0)
      std::fprintf(st.ok() ? stdout : stderr, "%s\n", st.ok() ? flags.usage().c_str() : ("untied bench attn: " + st.message()).c_str());
    return st.ok() ? 0 : 2;
  }
  const int threads = flags.get_string("threads").empty()
                          ? default_threads_per_rank(li.mpi ? local_ranks_under_mpirun() : ranks)
                          : static_cast<int>(flags.get_int("threads"));

  return run_ranks(argc, argv, li.mpi ? 1 : ranks, [&](Communicator& comm) {
    const int C = comm.size();
    std::vector<BenchRow> rows;
    for (const std::string& preset : presets) {
      for (bool rehearsal : {false, true}) {
        for (int64_t S : flags.get_int_list(rehearsal ? "mem-seqs" : "seqs")) {
          std::vector<std::pair<Strategy, int64_t>> runs = {{Strategy::kUlysses, 0}};
          for (int64_t m : flags.get_int_list("multiples")) runs.push_back({Strategy::kUPipe, m * C});
          for (auto [strategy, U] : runs) {
            AttentionConfig cfg;
            cfg.seq = S;
            cfg.dtype = dt.value();
            cfg.strategy = strategy;
            cfg.upipe_heads = U;
            apply_heads_preset(preset, &cfg);
            if (!validate(cfg, C).ok()) continue;  // e.g. U = 4C > H: not a valid stage size
            BenchRow row{preset, std::string(strategy_name(strategy)), rehearsal ? "rehearsal" : "run", 0, S, {}, 0, 0};
            AttnRunOptions o;
            o.threads = threads;
            o.rehearsal = rehearsal;
            row.r = run_attention(comm, cfg, o);
            row.U = row.r.stage_heads;
            row.paper = paper_mha_bytes(cfg, C, row.U);
            row.exact = gqa_exact_bytes(cfg, C, row.U);
            rows.push_back(row);
          }
        }
      }
    }
    if (comm.rank() != 0) return;
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
                    "\"paper_mha_formula_bytes\": %lld, \"gqa_exact_formula_bytes\": %lld}%s\n",
                    r.preset.c_str(), r.strategy.c_str(), (long long)r.U, C, (long long)r.seq, r.mode.c_str(),
                    r.r.fwd_ms, r.r.bwd_ms, (long long)r.r.intermediates_fwd, (long long)r.r.intermediates_bwd,
                    (long long)r.r.mem.peak_total, memory_json(r.r.mem).c_str(), (long long)r.paper, (long long)r.exact,
                    i + 1 < rows.size() ? "," : "");
      }
      std::printf("]\n");
      return;
    }
    std::printf("untied bench attn | %d ranks (%s) x %d thread%s | %s storage | per-rank figures, max over ranks\n", C,
                comm.backend().c_str(), threads, threads == 1 ? "" : "s", std::string(dtype_name(dt.value())).c_str());
    std::printf("%-10s %-8s %4s %8s %-9s %10s %10s %6s %12s %12s %7s %12s %12s\n", "preset", "strategy", "U", "seq", "mode",
                "fwd_ms", "bwd_ms", "t/uly", "inter_fwd", "inter_bwd", "m/uly", "formula_mha", "formula_gqa");
    for (const BenchRow& r : rows) {
      const BenchRow* b = base[r.preset + "/" + std::to_string(r.seq) + "/" + r.mode];
      char tr[16] = "-", mr[16] = "-";
      if (b && r.mode == "run") std::snprintf(tr, sizeof tr, "%.3f", (r.r.fwd_ms + r.r.bwd_ms) / (b->r.fwd_ms + b->r.bwd_ms));
      if (b) std::snprintf(mr, sizeof mr, "%.3f", double(r.r.intermediates_fwd) / double(b->r.intermediates_fwd));
      std::printf("%-10s %-8s %4lld %8lld %-9s %10s %10s %6s %12s %12s %7s %12s %12s\n", r.preset.c_str(), r.strategy.c_str(),
                  (long long)r.U, (long long)r.seq, r.mode.c_str(),
                  r.mode == "run" ? std::to_string(r.r.fwd_ms).substr(0, 9).c_str() : "-",
                  r.mode == "run" ? std::to_string(r.r.bwd_ms).substr(0, 9).c_str() : "-", tr,
                  format_bytes(r.r.intermediates_fwd).c_str(), format_bytes(r.r.intermediates_bwd).c_str(), mr,
                  format_bytes(r.paper).c_str(), format_bytes(r.exact).c_str());
    }
    std::printf("inter_fwd/inter_bwd: peak of attention workspace + communication buffers live together in forward /\n"
                "backward; m/uly: forward intermediates relative to Ulysses; t/uly: forward+backward time relative to\n"
                "Ulysses; formula_mha: 12*L*U*D bytes (bf16) as in the paper (K/V counted with U heads);\n"
                "formula_gqa: exact q/k/v projections + receive buffers at the first stage of a KV round.\n");
  });
}

}  // namespace untied::cli

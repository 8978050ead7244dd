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
#include <span>

#include "cli/args.h"
#include "cli/attn_runner.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "untied/attention/block_work.h"
#include "untied/core/json.h"
#include "cli/launch.h"
#include "cli/rank_device.h"

namespace untied::cli {

namespace {

// What the flags ask for, read and checked before any rank starts.
struct BenchAttnOptions {
  std::vector<std::string> presets;
  std::vector<int64_t> seqs, mem_seqs, multiples, rings;
  DType dtype = DType::kBF16;
  DeviceChoice device = DeviceChoice::kCpu;
  int ranks = -1;  // in-process ranks; -1 under mpirun
  int threads = 1;
  int64_t budget = 0;
  int warmup = 1;
  bool json = false;
  bool fit = false;
  std::vector<bool> overlaps = {false};  // upipe rows without and/or with --overlap
  std::vector<bool> keeps = {false};     // upipe rows without and/or with --upipe-keep-last
  int64_t fit_step = 0, fit_max = 0, fit_run_max = 0;
  int fit_headroom = 0;
  bool gpu() const { return device == DeviceChoice::kCuda; }
};

struct BenchRow {
  std::string preset, strategy, mode;
  int64_t U = 0, seq = 0;
  AttnRunResult r;
  int64_t paper = 0, exact = 0;
  double flops = 0;  // the block's forward + backward GEMM and attention FLOPs per rank (block_work.h)
};

struct Spec {
  Strategy strategy;
  int64_t upipe_heads;  // 0 for ulysses
  int64_t ring = 1;     // R: ulysses/upipe across R ring groups (ring: R = ranks)
  bool overlap = false; // upipe: AttentionConfig::overlap
  bool keep_last = false;  // upipe: AttentionSaved::keep_last_stage (AttnRunOptions::keep_last)
};

// "ulysses", "upipe", "ring", or with a ring degree: "ulysses+r2", "upipe+r2"; overlapped
// upipe: "upipe+overlap"; with its last stage kept: "upipe+keep".
std::string spec_name(const Spec& s) {
  std::string n(strategy_name(s.strategy));
  if (s.strategy != Strategy::kRing && s.ring > 1) n += "+r" + std::to_string(s.ring);
  if (s.overlap) n += "+overlap";
  if (s.keep_last) n += "+keep";
  return n;
}

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

// The memory each rank may use under --fit.
struct FitTarget {
  int64_t bytes = 0;
  int64_t free_bytes = 0;  // the GPU free memory it was taken from; 0: it is --mem-budget
};

AttentionConfig make_config(const std::string& preset, DType dtype, Spec spec, int64_t seq) {
  AttentionConfig cfg;
  cfg.seq = seq;
  cfg.dtype = dtype;
  cfg.strategy = spec.strategy;
  cfg.upipe_heads = spec.upipe_heads;
  cfg.ring = spec.strategy == Strategy::kRing ? 1 : spec.ring;
  cfg.overlap = spec.overlap;
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

void add_bench_attn_flags(FlagSet& flags) {
  flags.add("presets", FlagKind::kString, "llama3-8b,qwen3-32b", "head presets (comma separated)");
  flags.add("seqs", FlagKind::kIntList, "4K", "sequence lengths that are run and timed");
  flags.add("mem-seqs", FlagKind::kIntList, "128K,1M,3M", "sequence lengths measured in rehearsal (memory only)");
  flags.add("multiples", FlagKind::kIntList, "1,2,4", "UPipe stage sizes U as multiples of the ranks C per ring group");
  flags.add("rings", FlagKind::kIntList, "1",
            "ring degrees R: each adds ulysses and upipe across R ring groups of ranks/R (R = ranks: the ring strategy)");
  flags.add_choice("overlap", {"on", "off", "both", "auto"}, "auto",
                   "upipe rows with the next stage's exchanges overlapped: on, off, both (a row of each), or auto "
                   "(on with --device cuda, off on the CPU)");
  flags.add_choice("upipe-keep-last", {"on", "off", "both"}, "off",
            "upipe rows whose forward keeps its last stage's q, k and v for the backward, which then recomputes only "
            "the other stages': on, off, or both (a row of each)");
  add_dtype_flag(flags, "bf16");
  add_ranks_flag(flags, 8);
  add_device_flag(flags, std::string(kDeviceHelp) + ". Rehearsal rows are counted on the CPU as GPU ranks");
  add_threads_flag(flags, "cores / ranks, at least 1");
  flags.add_int("warmup", "1", "untimed forward+backward passes before each timed one", {0, 1000});
  add_mem_budget_flag(flags,
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
  flags.add_int("fit-headroom", "20",
            "--fit on a GPU without --mem-budget: percent of each rank's share of free memory kept for the CUDA "
            "context, cuBLAS workspaces and the caching allocator's unused blocks",
                {0, 99});
  flags.add("json", FlagKind::kBool, "false", "print a JSON array instead of the table");
}

// Reads the parsed flags into *o; a non-ok Status says which flag to change.
Status read_bench_attn_flags(const FlagSet& flags, const LaunchInfo& li, BenchAttnOptions* o) {
  Status st;
  std::string p = flags.get_string("presets"), item;
  for (size_t i = 0; i <= p.size(); ++i) {
    if (i == p.size() || p[i] == ',') {
      AttentionConfig probe;
      Status ps = apply_heads_preset(item, &probe);
      if (!ps.ok() && st.ok()) st = Status::invalid_argument("--presets: " + ps.message());
      o->presets.push_back(item);
      item.clear();
    } else {
      item += p[i];
    }
  }
  if (!st.ok()) return st;
  o->dtype = parse_dtype(flags.get_string("dtype")).value();
  o->device = parse_device_choice(flags.get_string("device")).value();
  const bool cuda = o->device == DeviceChoice::kCuda;
  using Rows = std::vector<bool>;  // (off, on) or one of them
  o->overlaps = flags.get_choice("overlap", std::vector{Rows{true}, Rows{false}, Rows{false, true}, Rows{cuda}});
  o->keeps = flags.get_choice("upipe-keep-last", std::vector{Rows{true}, Rows{false}, Rows{false, true}});
  o->ranks = li.launched ? -1 : static_cast<int>(flags.get_int("ranks"));
  o->fit = flags.get_bool("fit");
  o->fit_step = flags.get_int("fit-step");
  o->fit_max = flags.get_int("fit-max");
  o->fit_run_max = flags.get_int("fit-run-max");
  o->fit_headroom = static_cast<int>(flags.get_int("fit-headroom"));
  o->budget = flags.get_bytes("mem-budget");
  if (o->fit) {
    if (o->fit_step < 1) return Status::invalid_argument("--fit-step must be >= 1");
    if (!li.launched && o->fit_step % o->ranks != 0)
      return Status::invalid_argument("--fit-step " + std::to_string(o->fit_step) +
                                      " must be a multiple of the ranks (" + std::to_string(o->ranks) + ")");
    if (o->fit_max < o->fit_step || o->fit_run_max < o->fit_step)
      return Status::invalid_argument("--fit-max and --fit-run-max must be at least --fit-step");
    if (o->device == DeviceChoice::kCpu && o->budget == 0)
      return Status::invalid_argument("--fit on the CPU needs --mem-budget: the memory per rank to fit in");
  }
  o->seqs = flags.get_int_list("seqs");
  o->mem_seqs = flags.get_int_list("mem-seqs");
  o->multiples = flags.get_int_list("multiples");
  o->rings = flags.get_int_list("rings");
  o->threads = threads_from_flags(flags, li.launched ? local_ranks_launched() : o->ranks);
  o->warmup = static_cast<int>(flags.get_int("warmup"));
  o->json = flags.get_bool("json");
  return Status::ok_status();
}

// Where the timed rows run, for the header: "8 ranks (inproc) x 2 threads", or the GPU. On a GPU
// this makes each rank's device once, so that GPU refusals (none visible, a build without
// CUDA, a budget over the free memory) stop every rank before any rehearsal or run.
std::string where_rows_run(Communicator& world, const BenchAttnOptions& o) {
  const int C = world.size();
  if (o.gpu()) {
    RankDevice probe = make_rank_device(world, RankDeviceOptions{.device = o.device, .budget_bytes = o.budget});
    return std::to_string(C) + " ranks (" + probe.comm().backend() + ") on " + probe.dev().name();
  }
  return std::to_string(C) + " ranks (" + world.backend() + ") x " + std::to_string(o.threads) + " thread" +
         (o.threads == 1 ? "" : "s");
}

// Per ring degree R (--rings): Ulysses (the ring strategy when R = ranks), then UPipe at each
// --multiples of the C = ranks / R ranks of a group.
std::vector<Spec> strategy_specs(const BenchAttnOptions& o, int ranks) {
  std::vector<Spec> specs;
  for (int64_t R : o.rings) {
    if (R < 1 || ranks % R != 0) continue;  // not a layout of these ranks
    const int64_t C = ranks / R;
    specs.push_back({R == ranks && R > 1 ? Strategy::kRing : Strategy::kUlysses, 0, R});
    for (int64_t m : o.multiples)
      for (bool ov : o.overlaps)
        for (bool keep : o.keeps) specs.push_back({Strategy::kUPipe, m * C, R, ov, keep});
  }
  return specs;
}

// --- the table of timed and rehearsed rows ---

// Every preset, length and strategy: timed runs at --seqs, rehearsals at --mem-seqs.
std::vector<BenchRow> run_rows(Communicator& world, const BenchAttnOptions& o, const std::vector<Spec>& specs) {
  const int C = world.size();
  std::vector<BenchRow> rows;
  for (const std::string& preset : o.presets) {
    for (bool rehearsal : {false, true}) {
      for (int64_t S : rehearsal ? o.mem_seqs : o.seqs) {
        for (Spec spec : specs) {
          AttentionConfig cfg = make_config(preset, o.dtype, spec, S);
          if (!validate(cfg, C).ok()) continue;  // e.g. U = 4C > H: not a valid stage size
          BenchRow row{preset, spec_name(spec), rehearsal ? "rehearsal" : "run", 0, S, {}, 0, 0, 0};
          AttnRunOptions ro;
          ro.device = o.device;
          ro.threads = o.threads;
          ro.rehearsal = rehearsal;
          ro.warmup = o.warmup;
          ro.keep_last = spec.keep_last;
          if (!rehearsal) ro.budget_bytes = o.budget;
          row.r = run_attention(world, cfg, ro);
          row.U = row.r.stage_heads;
          row.paper = paper_mha_bytes(cfg, C, row.U);
          row.exact = gqa_exact_bytes(cfg, C, row.U);
          const BlockWork work = block_work(padded_config(cfg, C), C, spec.keep_last);
          row.flops = work.forward_flops() + work.backward_flops();
          rows.push_back(row);
        }
      }
    }
  }
  return rows;
}

void print_rows_json(const std::vector<BenchRow>& rows, int C) {
  std::vector<Json> out;
  for (const BenchRow& r : rows) {
    Json j;
    j["preset"] = r.preset;
    j["strategy"] = r.strategy;
    j["upipe_heads"] = r.U;
    j["ranks"] = C;
    j["seq"] = r.seq;
    j["mode"] = r.mode;
    j["fwd_ms"] = as_printed("%.3f", r.r.fwd_ms);
    j["bwd_ms"] = as_printed("%.3f", r.r.bwd_ms);
    j["attn_intermediate_bytes_fwd"] = r.r.intermediates_fwd;
    j["attn_intermediate_bytes_bwd"] = r.r.intermediates_bwd;
    j["peak_bytes"] = r.r.mem.peak_total;
    j["peak_bytes_by_tag"] = peak_bytes_by_tag(r.r.mem);
    j["paper_mha_formula_bytes"] = r.paper;
    j["gqa_exact_formula_bytes"] = r.exact;
    j["block_flops"] = r.flops;
    j["device"] = r.r.device_name;
    out.push_back(std::move(j));
  }
  print_json_rows(out);
}

void print_rows_table(const std::vector<BenchRow>& rows, const BenchAttnOptions& o, const std::string& where,
                      int per_gpu) {
  // Ratios against the Ulysses row of the same preset, length and mode.
  std::map<std::string, const BenchRow*> base;
  for (const BenchRow& r : rows)
    if (r.strategy == "ulysses") base[r.preset + "/" + std::to_string(r.seq) + "/" + r.mode] = &r;
  std::printf("untied bench attn | %s | %s storage | per-rank figures, max over ranks\n", where.c_str(),
              std::string(dtype_name(o.dtype)).c_str());
  std::fputs(cpu_kernels_lines(o.device).c_str(), stdout);
  std::printf("%-10s %-18s %4s %8s %-9s %10s %10s %6s %6s %12s %12s %7s %12s %12s %12s\n", "preset", "strategy", "U",
              "seq", "mode", "fwd_ms", "bwd_ms", "t/uly", "w/uly", "inter_fwd", "inter_bwd", "m/uly", "peak",
              "formula_mha", "formula_gqa");
  for (const BenchRow& r : rows) {
    const BenchRow* b = base[r.preset + "/" + std::to_string(r.seq) + "/" + r.mode];
    char tr[16] = "-", wr[16] = "-", mr[16] = "-";
    if (b && r.mode == "run") std::snprintf(tr, sizeof tr, "%.3f", (r.r.fwd_ms + r.r.bwd_ms) / (b->r.fwd_ms + b->r.bwd_ms));
    if (b) std::snprintf(wr, sizeof wr, "%.3f", r.flops / b->flops);
    if (b) std::snprintf(mr, sizeof mr, "%.3f", double(r.r.intermediates_fwd) / double(b->r.intermediates_fwd));
    std::printf("%-10s %-18s %4lld %8lld %-9s %10s %10s %6s %6s %12s %12s %7s %12s %12s %12s\n", r.preset.c_str(),
                r.strategy.c_str(), (long long)r.U, (long long)r.seq, r.mode.c_str(),
                r.mode == "run" ? std::to_string(r.r.fwd_ms).substr(0, 9).c_str() : "-",
                r.mode == "run" ? std::to_string(r.r.bwd_ms).substr(0, 9).c_str() : "-", tr, wr,
                format_bytes(r.r.intermediates_fwd).c_str(), format_bytes(r.r.intermediates_bwd).c_str(), mr,
                format_bytes(r.r.mem.peak_total).c_str(), format_bytes(r.paper).c_str(), format_bytes(r.exact).c_str());
  }
  std::printf("inter_fwd/inter_bwd: peak of attention workspace + communication buffers live together in forward /\n"
              "backward; m/uly: forward intermediates relative to Ulysses; t/uly: forward+backward time relative to\n"
              "Ulysses; w/uly: GEMM and attention FLOPs relative to Ulysses' (upipe's backward projects q, k and v\n"
              "again, +keep all but its last stage's): where compute is the time, t/uly does not go below it;\n"
              "peak: all bytes of the rank at its peak (weights, gradients, inputs, outputs included);\n"
              "formula_mha: 12*L*U*D bytes (bf16) as in the paper (K/V counted with U heads);\n"
              "formula_gqa: exact q/k/v projections + receive buffers at the first stage of a KV round.\n");
  if (o.gpu())
    std::printf("run rows on %s%s; rehearsal rows counted on the CPU as GPU ranks (one kernel thread each).\n",
                where.c_str(), per_gpu > 1 ? ", one GPU shared by all ranks (each on its own stream)" : "");
}

// --- --fit: the longest sequence per strategy, then times at one length ---

// Collective: --mem-budget, or the GPUs' free memory shared by the ranks on one, less the headroom.
FitTarget fit_target(Communicator& world, const BenchAttnOptions& o) {
  FitTarget t{.bytes = o.budget};
  if (t.bytes == 0) {
    t.free_bytes = agreed_gpu_free_bytes(world);
    t.bytes = t.free_bytes / ranks_per_gpu(world) / 100 * (100 - o.fit_headroom);
  }
  check_all_ranks(world, o.fit_step % world.size() == 0
                             ? Status::ok_status()
                             : Status::invalid_argument("--fit-step must be a multiple of the ranks (" +
                                                        std::to_string(world.size()) + ")"));
  return t;
}

// Collective: the longest multiple of --fit-step (at most --fit-max) whose rehearsal peak per
// rank, max over ranks, fits `target`. Every rank gets the same answers and takes the same path
// through the search.
FitRow longest_fit(Communicator& world, const BenchAttnOptions& o, const std::string& preset, Spec spec,
                   int64_t target) {
  const int C = world.size();
  const int64_t step = o.fit_step, fit_max = o.fit_max / step * step;
  FitRow row;
  row.preset = preset;
  row.strategy = spec_name(spec);
  row.spec = spec;
  std::map<int64_t, int64_t> peak;
  auto fits = [&](int64_t S) {
    const AttentionConfig cfg = make_config(preset, o.dtype, spec, S);
    if (!validate(cfg, C).ok()) return false;
    AttnRunOptions ro;
    ro.device = o.device;
    ro.threads = o.threads;
    ro.rehearsal = true;
    ro.keep_last = spec.keep_last;
    const AttnRunResult r = run_attention(world, cfg, ro);
    row.U = r.stage_heads;
    peak[S] = r.mem.peak_total;
    return r.mem.peak_total <= target;
  };
  // Double from one step while it fits, then bisect in steps between the last length that
  // fits (lo) and the first that does not, or one step past --fit-max (hi).
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
  return row;
}

// Collective: times every row of one preset at the longest length they all fit, at most
// --fit-run-max (none when one of them fits no length).
void time_at_common_length(Communicator& world, const BenchAttnOptions& o, std::span<FitRow> rows) {
  const int64_t step = o.fit_step;
  int64_t run_seq = o.fit_run_max / step * step;
  for (const FitRow& row : rows) run_seq = std::min(run_seq, row.max_seq);
  if (run_seq <= 0) return;
  for (FitRow& row : rows) {
    AttnRunOptions ro;
    ro.device = o.device;
    ro.threads = o.threads;
    ro.budget_bytes = o.budget;
    ro.warmup = o.warmup;
    ro.keep_last = row.spec.keep_last;
    row.run = run_attention(world, make_config(row.preset, o.dtype, row.spec, run_seq), ro);
    row.run_seq = run_seq;
  }
}

std::vector<FitRow> fit_rows(Communicator& world, const BenchAttnOptions& o, const std::vector<Spec>& specs,
                             int64_t target) {
  std::vector<FitRow> rows;
  for (const std::string& preset : o.presets) {
    const size_t first = rows.size();
    for (Spec spec : specs) {
      if (!validate(make_config(preset, o.dtype, spec, o.fit_step), world.size()).ok()) continue;  // e.g. U > H
      rows.push_back(longest_fit(world, o, preset, spec, target));
    }
    time_at_common_length(world, o, std::span<FitRow>(rows).subspan(first));
  }
  return rows;
}

void print_fit_json(const std::vector<FitRow>& rows, int C, const FitTarget& target) {
  std::vector<Json> out;
  for (const FitRow& r : rows) {
    Json j;
    j["preset"] = r.preset;
    j["strategy"] = r.strategy;
    j["upipe_heads"] = r.U;
    j["ranks"] = C;
    j["fit_target_bytes"] = target.bytes;
    j["max_seq"] = r.max_seq;
    j["peak_bytes_at_max_seq"] = r.peak_at_max;
    j["run_seq"] = r.run_seq;
    j["fwd_ms"] = as_printed("%.3f", r.run.fwd_ms);
    j["bwd_ms"] = as_printed("%.3f", r.run.bwd_ms);
    j["peak_bytes"] = r.run.mem.peak_total;
    j["attn_intermediate_bytes_fwd"] = r.run.intermediates_fwd;
    j["attn_intermediate_bytes_bwd"] = r.run.intermediates_bwd;
    j["gpu_reserved_bytes"] = r.run.reserved_peak;
    j["peak_bytes_by_tag"] = peak_bytes_by_tag(r.run.mem);
    j["device"] = r.run.device_name;
    out.push_back(std::move(j));
  }
  print_json_rows(out);
}

void print_fit_table(const std::vector<FitRow>& rows, const BenchAttnOptions& o, const FitTarget& target,
                     const std::string& where, int C, int per_gpu) {
  const bool gpu = o.gpu();
  std::string target_text = format_bytes(target.bytes) + " per rank";
  if (target.free_bytes > 0)
    target_text += " (" + format_bytes(target.free_bytes) + " free / " + std::to_string(per_gpu) + " rank" +
                   (per_gpu == 1 ? "" : "s") + " per GPU, less " + std::to_string(o.fit_headroom) + "%)";
  else
    target_text += " (--mem-budget: a length fits when its peak of counted buffers is at most this, no headroom "
                   "added, as untied plan --fit and train --fit-seq)";
  std::printf("untied bench attn --fit | %s | %s storage | memory to fit in: %s\n", where.c_str(),
              std::string(dtype_name(o.dtype)).c_str(), target_text.c_str());
  std::printf("%-10s %-18s %4s %9s %12s | %8s %10s %10s %6s %12s %12s %12s%s\n", "preset", "strategy", "U",
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
    std::printf("%-10s %-18s %4lld %9lld %12s | %8s %10s %10s %6s %12s %12s %12s%s\n", r.preset.c_str(),
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
              (long long)o.fit_step, gpu ? " (rehearsal counted as GPU ranks, one kernel thread each)" : "",
              gpu ? "; gpu_reserved: the most its caching allocator held from cudaMalloc\n(cached blocks "
                    "of other sizes included), the footprint the headroom is for"
                  : "");
  if (gpu && per_gpu > 1)
    std::printf("%d in-process ranks share one GPU, each on its own stream: times are those of all ranks' work "
                "on one GPU.\n", C);
}

}  // namespace

int bench_attn_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied bench attn",
                "Ulysses vs UPipe (U = C, 2C, 4C) for real head shapes: time and attention-layer memory per rank.\n"
                "With --fit: the longest sequence each strategy fits per rank, and times at one length all fit.");
  add_bench_attn_flags(flags);
  const LaunchInfo li = launch_info();
  if (auto exit = parse_command_line(flags, args, li.world_rank == 0)) return *exit;
  BenchAttnOptions o;
  if (Status st = read_bench_attn_flags(flags, li, &o); !st.ok()) return refuse(flags, st, li.world_rank == 0);

  return run_ranks(argc, argv, li.launched ? 1 : o.ranks, [&](Communicator& world) {
    const std::string where = where_rows_run(world, o);
    const std::vector<Spec> specs = strategy_specs(o, world.size());
    if (o.fit) {
      const FitTarget target = fit_target(world, o);
      const std::vector<FitRow> rows = fit_rows(world, o, specs, target.bytes);
      if (world.rank() != 0) return;
      if (o.json) print_fit_json(rows, world.size(), target);
      else print_fit_table(rows, o, target, where, world.size(), ranks_per_gpu(world));
      return;
    }
    const std::vector<BenchRow> rows = run_rows(world, o, specs);
    if (world.rank() != 0) return;
    if (o.json) print_rows_json(rows, world.size());
    else print_rows_table(rows, o, where, ranks_per_gpu(world));
  });
}

}  // namespace untied::cli

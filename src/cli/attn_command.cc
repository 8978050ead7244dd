// `untied attn`: one attention block forward and backward with the given shapes and strategy,
// on C ranks (mpirun -np C, or --ranks C in-process). Prints time per phase and peak bytes per
// tag (max over ranks); --json prints one object; --dump DIR writes the global tensors as .npy.
// --device cuda runs it on GPUs (rank_device.h: in-process ranks share GPU 0; under mpirun one
// GPU per rank with NCCL).
#include <cstdio>

#include "cli/args.h"
#include "cli/attn_runner.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "untied/core/json.h"
#include "cli/launch.h"

namespace untied::cli {

void add_attention_flags(FlagSet& f) {
  f.add("seq", FlagKind::kInt, "4096",
        "global sequence length S (any: padded to a multiple of the ranks, or of 2*ranks with a ring, with tokens "
        "nothing attends to)");
  f.add("docs", FlagKind::kString, "",
        "packed documents: their lengths, summing to S, e.g. 100,28,128 (each attends only to itself; RoPE restarts)");
  f.add("window", FlagKind::kInt, "0", "sliding window: a query at p sees keys in (p-W, p] (default: none)");
  f.add("heads-like", FlagKind::kString, "", "head preset: a model preset's attention (llama3-8b: H 32 G 8 D 128 E 4096; qwen3-32b: H 64 G 8 D 128 E 5120; ...)");
  f.add("hidden", FlagKind::kInt, "1024", "model width E");
  f.add("heads", FlagKind::kInt, "16", "query heads H");
  f.add("kv-heads", FlagKind::kInt, "4", "KV heads G (divides H)");
  f.add("head-dim", FlagKind::kInt, "64", "head dimension D (even)");
  add_rope_theta_flag(f, "500000", "RoPE base theta");
  add_strategy_flag(f, "local, ulysses, upipe or ring");
  f.add("upipe-heads", FlagKind::kInt, "0",
        "heads per UPipe stage U: a multiple of the ranks per ring group dividing H (0 = ranks per group)");
  f.add("ring", FlagKind::kInt, "1",
        "ring degree R of ulysses/upipe: R groups of ranks/R consecutive ranks, zig-zag ring attention across them");
  f.add_choice("ring-order", {"zigzag", "contiguous"}, "zigzag",
        "ring layout: zigzag (causal balance), or contiguous (to measure the imbalance zigzag removes)");
  f.add("ring-overlap", FlagKind::kBool, "true",
        "overlap each ring exchange with compute (--no-ring-overlap waits at once: the exchanges' whole cost)");
  add_overlap_flag(f);
  f.add("upipe-keep-last", FlagKind::kBool, "false",
        "upipe: forward keeps its last stage's q, k and v and the backward starts with them instead of projecting "
        "and exchanging them again (the same bits; they stay beside that stage's output exchange)");
  f.add("early-delta", FlagKind::kBool, "true",
        "ulysses/upipe: compute every head's D = rowsum(dO * O) first in the backward and free the saved output "
        "(--no-early-delta keeps it through the stages: one (L, H*D) buffer more, one dO projection less)");
  add_dtype_flag(f, "f32");
  f.add_int("seed", "1", "seed of the random inputs and weights", {.min = 0});
  add_ranks_flag(f, 1, "in-process ranks (threads) when not launched by mpirun");
  add_device_flag(f);
  add_threads_flag(f);
  add_mem_budget_flag(f, "per-rank memory budget, e.g. 512M, 8G (default: none)");
  f.add_int("warmup", "1", "untimed forward+backward passes before the measured one", {0, 1000});
  f.add("rehearsal", FlagKind::kBool, "false",
        "count every allocation without backing it; skip compute (exact peaks). Runs on the CPU's counting "
        "device with any --device (with cuda: one kernel thread per rank, as a GPU rank; no GPU needed)");
}

// Fills cfg from the flags; a non-ok Status says which flag to change.
Status attention_config_from_flags(const FlagSet& f, AttentionConfig* cfg) {
  cfg->seq = f.get_int("seq");
  cfg->hidden = f.get_int("hidden");
  cfg->heads = f.get_int("heads");
  cfg->kv_heads = f.get_int("kv-heads");
  cfg->head_dim = f.get_int("head-dim");
  cfg->rope_theta = f.get_number("rope-theta");
  if (!f.get_string("heads-like").empty()) {
    for (const char* flag : {"hidden", "heads", "kv-heads", "head-dim"})
      if (f.was_set(flag))
        return Status::invalid_argument(std::string("--heads-like sets the head shapes; drop --") + flag);
    Status s = apply_heads_preset(f.get_string("heads-like"), cfg);
    if (!s.ok()) return Status::invalid_argument("--heads-like: " + s.message());
    if (f.was_set("rope-theta")) cfg->rope_theta = f.get_number("rope-theta");
  }
  cfg->strategy = parse_strategy(f.get_string("strategy")).value();
  cfg->dtype = parse_dtype(f.get_string("dtype")).value();
  cfg->upipe_heads = f.get_int("upipe-heads");
  cfg->ring = f.get_int("ring");
  cfg->ring_order = f.get_choice("ring-order", std::vector{RingOrder::kZigzag, RingOrder::kContiguous});
  cfg->ring_overlap = f.get_bool("ring-overlap");
  cfg->early_delta = f.get_bool("early-delta");
  if (cfg->upipe_heads != 0 && cfg->strategy != Strategy::kUPipe)
    return Status::invalid_argument("--upipe-heads applies to --strategy upipe only");
  return Status::ok_status();
}

int attn_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied attn", "One attention block forward and backward: time per phase and peak memory per tag.");
  add_attention_flags(flags);
  flags.add("dump", FlagKind::kString, "", "write x, dy, y, dx, weights and weight gradients (.npy) and meta.json here");
  flags.add("json", FlagKind::kBool, "false", "print one JSON object instead of the table");
  const LaunchInfo li = launch_info();
  const bool root = li.world_rank == 0;
  if (auto exit = parse_command_line(flags, args, root)) return *exit;
  AttentionConfig cfg;
  Status st = attention_config_from_flags(flags, &cfg);
  const int ranks = li.launched ? -1 : static_cast<int>(flags.get_int("ranks"));  // (in kRanksRange)
  const DeviceChoice device = parse_device_choice(flags.get_string("device")).value();
  cfg.overlap = overlap_from_flags(flags, device == DeviceChoice::kCuda);
  if (st.ok() && !flags.get_string("dump").empty()) st = prepare_dump_dir(flags.get_string("dump"));
  if (st.ok() && li.launched && flags.was_set("ranks"))
    st = Status::invalid_argument("--ranks is for in-process runs; under mpirun the ranks are mpirun's -np");
  if (!st.ok()) return refuse(flags, st, root);
  AttnRunOptions opts;
  opts.device = device;
  opts.threads = threads_from_flags(flags, li.launched ? local_ranks_launched() : ranks);
  opts.budget_bytes = flags.get_bytes("mem-budget");
  opts.rehearsal = flags.get_bool("rehearsal");
  opts.warmup = static_cast<int>(flags.get_int("warmup"));
  opts.seed = static_cast<uint64_t>(flags.get_int("seed"));
  opts.dump_dir = flags.get_string("dump");
  opts.keep_last = flags.get_bool("upipe-keep-last");
  Status mask_st = Status::ok_status();
  if (flags.was_set("window")) {
    opts.window = flags.get_int("window");
    if (opts.window < 1)
      mask_st = Status::invalid_argument("--window " + std::to_string(opts.window) +
                                         ": a window holds at least 1 key (the query itself); drop --window for none");
  }
  if (mask_st.ok() && !flags.get_string("docs").empty()) {
    auto lens = parse_int_list(flags.get_string("docs"));
    if (!lens.ok()) mask_st = Status::invalid_argument("--docs: " + lens.status().message());
    if (mask_st.ok()) {
      opts.doc_lens = lens.value();
      auto m = SequenceMask::from_lengths(opts.doc_lens, opts.window);
      if (!m.ok()) mask_st = Status::invalid_argument("--docs: " + m.status().message());
      else if (m.value().seq() != cfg.seq)
        mask_st = Status::invalid_argument("--docs: the document lengths sum to " + std::to_string(m.value().seq()) +
                                           ", not to --seq " + std::to_string(cfg.seq) + "; make them add up to S");
    }
  }
  if (!mask_st.ok()) return refuse(flags, mask_st, root);
  const bool json = flags.get_bool("json");

  return run_ranks(argc, argv, li.launched ? 1 : ranks, [&](Communicator& comm) {
    // The configuration is checked on every rank before any allocation or compute; the device
    // (GPU present, budget) in run_attention, also before any compute.
    check_all_ranks(comm, validate(padded_config(cfg, comm.size()), comm.size()));
    AttnRunResult r = run_attention(comm, cfg, opts);
    if (comm.rank() != 0) return;
    const int64_t U = r.stage_heads;
    const int threads = opts.device == DeviceChoice::kCpu ? opts.threads : 1;  // a GPU rank's kernels: 1
    const int64_t paper = paper_mha_bytes(cfg, comm.size(), U), exact = gqa_exact_bytes(cfg, comm.size(), U);
    if (json) {
      Json j;
      j["strategy"] = strategy_name(cfg.strategy);
      j["ranks"] = comm.size();
      j["seq"] = cfg.seq;
      j["padded_seq"] = r.padded_seq;
      j["docs"] = opts.doc_lens.empty() ? 1 : static_cast<int64_t>(opts.doc_lens.size());
      j["window"] = opts.window;
      j["hidden"] = cfg.hidden;
      j["heads"] = cfg.heads;
      j["kv_heads"] = cfg.kv_heads;
      j["head_dim"] = cfg.head_dim;
      j["dtype"] = dtype_name(cfg.dtype);
      j["upipe_heads"] = U;
      j["ring"] = ring_degree(cfg, comm.size());
      j["stages"] = cfg.heads / U;
      j["overlap"] = cfg.overlap && cfg.heads / U > 1;
      j["threads"] = threads;
      j["rehearsal"] = opts.rehearsal;
      j["fwd_ms"] = as_printed("%.3f", r.fwd_ms);
      j["bwd_ms"] = as_printed("%.3f", r.bwd_ms);
      j["peak_bytes"] = r.mem.peak_total;
      j["peak_bytes_by_tag"] = peak_bytes_by_tag(r.mem);
      j["attn_intermediate_bytes_fwd"] = r.intermediates_fwd;
      j["attn_intermediate_bytes_bwd"] = r.intermediates_bwd;
      j["paper_mha_formula_bytes"] = paper;
      j["gqa_exact_formula_bytes"] = exact;
      j["ring_exchanges"] = r.ring.exchanges;
      j["ring_bytes_sent"] = r.ring.bytes_sent;
      j["ring_wait_ms"] = as_printed("%.3f", r.ring.wait_s * 1e3);
      j["ring_compute_ms_max"] = as_printed("%.3f", r.ring.compute_s * 1e3);
      j["ring_compute_ms_min"] = as_printed("%.3f", r.ring_compute_min_s * 1e3);
      j["device"] = r.device_name;
      std::printf("%s\n", json_line(j).c_str());
      return;
    }
    // Where the ranks ran: "8 ranks (inproc) x 2 threads" on the CPU, "8 ranks (inproc) on
    // cuda:0 (NVIDIA H200)" on a GPU.
    std::string where = std::to_string(comm.size()) + " ranks (" + r.backend + ")";
    if (opts.device == DeviceChoice::kCuda && !opts.rehearsal)
      where += " on " + r.device_name;
    else
      where += " x " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s");
    const char* note = !opts.rehearsal ? ""
                       : opts.device == DeviceChoice::kCpu
                           ? " | rehearsal: memory counted, compute skipped"
                           : " | rehearsal: memory counted on the CPU's counting device as a GPU rank, compute skipped";
    const int R = ring_degree(cfg, comm.size());
    const std::string ring = R > 1 && cfg.strategy != Strategy::kRing
                                 ? " x ring " + std::to_string(R) + " (" + std::to_string(comm.size() / R) + " ranks per group)"
                                 : "";
    const bool overlapped = cfg.overlap && cfg.heads / U > 1;
    std::printf("untied attn | %s%s, U=%lld (%lld stages%s) | %s | %s | S=%lld E=%lld H=%lld G=%lld D=%lld%s\n",
                std::string(strategy_name(cfg.strategy)).c_str(), ring.c_str(), (long long)U, (long long)(cfg.heads / U),
                overlapped ? ", overlapped" : "",
                where.c_str(), std::string(dtype_name(cfg.dtype)).c_str(), (long long)cfg.seq, (long long)cfg.hidden,
                (long long)cfg.heads, (long long)cfg.kv_heads, (long long)cfg.head_dim, note);
    if (!opts.rehearsal) std::fputs(cpu_kernels_lines(opts.device).c_str(), stdout);
    if (!opts.doc_lens.empty() || opts.window > 0 || r.padded_seq != cfg.seq) {
      std::string docs = opts.doc_lens.empty() ? "one document" : std::to_string(opts.doc_lens.size()) + " documents (";
      for (size_t i = 0; i < opts.doc_lens.size() && i < 8; ++i) docs += (i ? "," : "") + std::to_string(opts.doc_lens[i]);
      if (!opts.doc_lens.empty()) docs += opts.doc_lens.size() > 8 ? ",...)" : ")";
      std::printf("  mask      %s%s%s\n", docs.c_str(),
                  opts.window > 0 ? (", window " + std::to_string(opts.window)).c_str() : "",
                  r.padded_seq != cfg.seq ? (", padded to " + std::to_string(r.padded_seq) + " (" +
                                             std::to_string(r.padded_seq - cfg.seq) + " tokens nothing attends to)").c_str()
                                          : "");
    }
    std::printf("  forward   %10.2f ms\n  backward  %10.2f ms\n", r.fwd_ms, r.bwd_ms);
    if (r.ring.exchanges > 0)
      std::printf("  ring      %lld exchanges, %s sent per rank; waiting for them %.2f ms (slowest rank); ring "
                  "attention compute %.2f .. %.2f ms per rank (max/min %.3f)\n",
                  (long long)r.ring.exchanges, format_bytes(r.ring.bytes_sent).c_str(), r.ring.wait_s * 1e3,
                  r.ring_compute_min_s * 1e3, r.ring.compute_s * 1e3,
                  r.ring_compute_min_s > 0 ? r.ring.compute_s / r.ring_compute_min_s : 0.0);
    std::printf("peak memory per rank (max over ranks):\n");
    for (int t = 0; t < kNumTags; ++t)
      std::printf("  %-16s %14s\n", std::string(tag_name(static_cast<Tag>(t))).c_str(), format_bytes(r.mem.peak[t]).c_str());
    std::printf("  %-16s %14s\n", "total", format_bytes(r.mem.peak_total).c_str());
    if (r.reserved_peak > 0)
      std::printf("  %-16s %14s  (held from cudaMalloc at most, cached blocks included)\n", "gpu reserved",
                  format_bytes(r.reserved_peak).c_str());
    std::printf("attention intermediates (attn_workspace + communication live together):\n");
    std::printf("  forward  %14s   backward %14s\n", format_bytes(r.intermediates_fwd).c_str(),
                format_bytes(r.intermediates_bwd).c_str());
    std::printf("  formulas: paper MHA-style 6*%lldB*L*U*D = %s; exact q/k/v projections + receive buffers = %s\n",
                (long long)dtype_size(cfg.dtype), format_bytes(paper).c_str(), format_bytes(exact).c_str());
    if (!opts.dump_dir.empty()) std::printf("wrote %s/{x,dy,y,dx,wq,wk,wv,wo,dwq,dwk,dwv,dwo}.npy and meta.json\n", opts.dump_dir.c_str());
  });
}

}  // namespace untied::cli

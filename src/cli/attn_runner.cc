#include "cli/attn_runner.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "untied/core/json.h"
#include "untied/attention/head_schedule.h"
#include "untied/core/npy.h"
#include "untied/core/random.h"
#include "untied/device/device.h"
#include "untied/model/model_config.h"

namespace untied::cli {
namespace {

// Random streams of the global tensors.
enum Stream : uint64_t { kX = 1, kDy, kWq, kWk, kWv, kWo };

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t reduce_max(Communicator& comm, int64_t v) {
  comm.all_reduce(&v, &v, 1, DType::kI64, ReduceOp::kMax);
  return v;
}

MemoryStats reduce_max(Communicator& comm, MemoryStats m) {
  for (auto& v : m.peak) v = reduce_max(comm, v);
  for (auto& v : m.at_total_peak) v = reduce_max(comm, v);
  m.peak_total = reduce_max(comm, m.peak_total);
  for (auto& ph : m.phase_peak_total) ph = reduce_max(comm, ph);
  return m;
}

// Rank 0 gets the global (S, E) tensor gathered in sequence order, as float32: every rank's rows
// put at their positions (token_layout.h).
std::vector<float> gather_rows(Communicator& world, Device& dev, const Tensor& t, const TokenLayout& layout) {
  const int64_t rows = t.dim(0), cols = t.numel() / rows;
  std::vector<float> local = host_f32(dev, t), all(static_cast<size_t>(t.numel() * world.size()));
  world.all_gather(local.data(), all.data(), t.numel() * 4);
  std::vector<float> ordered(all.size());
  for (int r = 0; r < world.size(); ++r)
    for (const TokenSegment& s : layout.rank_segments(r))
      std::copy(all.begin() + (r * rows + s.first_row) * cols, all.begin() + (r * rows + s.first_row + s.length) * cols,
                ordered.begin() + s.first_position * cols);
  return ordered;
}

// The rows of t (this rank's tokens) = the global tensor's rows at this rank's positions; zero at
// positions >= real (the padding).
void fill_rows(Device& dev, const Tensor& t, const TokenLayout& layout, int rank, uint64_t seed, uint64_t stream,
               int64_t real) {
  const int64_t cols = t.numel() / t.dim(0);
  for (const TokenSegment& s : layout.rank_segments(rank)) {
    const int64_t n = std::clamp<int64_t>(real - s.first_position, 0, s.length);
    if (n > 0) fill_hash_uniform_on(dev, t.slice0(s.first_row, s.first_row + n), seed, stream, s.first_position * cols, 1.0f);
    if (n < s.length && dev.backed())
      dev.fill_zero(t.slice0(s.first_row + n, s.first_row + s.length).data(), (s.length - n) * cols * dtype_size(t.dtype()));
  }
}

std::vector<float> sum_over_ranks(Communicator& world, Device& dev, const Tensor& t) {
  std::vector<float> v = host_f32(dev, t);
  world.all_reduce(v.data(), v.data(), t.numel(), DType::kF32, ReduceOp::kSum);
  return v;
}

void write(const std::string& dir, const char* name, const std::vector<int64_t>& shape, const std::vector<float>& v) {
  Status s = write_npy(dir + "/" + name, shape, v.data());
  UNTIED_CHECK_KIND(ErrorKind::kIo, s.ok(), s.message());
}

}  // namespace

Status apply_heads_preset(const std::string& name, AttentionConfig* cfg) {
  auto m = model_preset(name);  // any model preset's attention: its heads, head size, width and RoPE base
  if (!m.ok()) return Status::invalid_argument("unknown head preset '" + name + "': use a model preset (" +
                                               model_preset_names() + ")");
  cfg->heads = m.value().heads, cfg->kv_heads = m.value().kv_heads, cfg->head_dim = m.value().head_dim;
  cfg->hidden = m.value().hidden, cfg->rope_theta = m.value().rope_theta;
  return Status::ok_status();
}

int64_t paper_mha_bytes(const AttentionConfig& cfg, int ranks, int64_t U) {
  return 6 * dtype_size(cfg.dtype) * (cfg.seq / ranks) * U * cfg.head_dim;
}

int64_t gqa_exact_bytes(const AttentionConfig& cfg, int ranks, int64_t U) {
  auto s = make_head_schedule(cfg.heads, cfg.kv_heads, ranks, U);
  if (!s.ok()) return 0;
  const int64_t kv = ranks * s.value().kv_per_rank;
  return dtype_size(cfg.dtype) * 2 * (cfg.seq / ranks) * cfg.head_dim * (U + 2 * kv);
}

Status prepare_dump_dir(const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || ::access(dir.c_str(), W_OK) != 0)
    return Status::io_error("--dump " + dir + ": cannot create or write that directory; choose a writable path");
  return Status::ok_status();
}

AttnRunResult run_attention(Communicator& world, const AttentionConfig& cfg, const AttnRunOptions& opts) {
  RankDevice rd = make_rank_device(world, RankDeviceOptions{.device = opts.device, .threads = opts.threads,
                                                            .budget_bytes = opts.budget_bytes,
                                                            .rehearsal = opts.rehearsal});
  Device& dev = rd.dev();
  Communicator& comm = rd.comm();  // moves the block's device buffers; figures go over `world`
  Allocator& alloc = dev.allocator();
  const AttentionConfig run_cfg = padded_config(cfg, comm.size());
  auto block = make_attention_block(dev, comm, run_cfg);
  const SequenceMask real_mask = opts.doc_lens.empty() ? SequenceMask(cfg.seq, opts.window)
                                                       : SequenceMask::from_lengths(opts.doc_lens, opts.window).value();
  const SequenceMask mask = real_mask.padded_to(run_cfg.seq);
  const int64_t C = comm.size(), L = run_cfg.seq / C, E = cfg.hidden, HD = cfg.heads * cfg.head_dim,
                GD = cfg.kv_heads * cfg.head_dim;
  const DType t = cfg.dtype;
  const float ws = 1.0f / std::sqrt(static_cast<float>(E)), wos = 1.0f / std::sqrt(static_cast<float>(HD));

  TensorBuffer wq(alloc, t, {HD, E}, Tag::kParameters, "wq"), wk(alloc, t, {GD, E}, Tag::kParameters, "wk"),
      wv(alloc, t, {GD, E}, Tag::kParameters, "wv"), wo(alloc, t, {E, HD}, Tag::kParameters, "wo");
  TensorBuffer dwq(alloc, t, {HD, E}, Tag::kGradients, "dwq"), dwk(alloc, t, {GD, E}, Tag::kGradients, "dwk"),
      dwv(alloc, t, {GD, E}, Tag::kGradients, "dwv"), dwo(alloc, t, {E, HD}, Tag::kGradients, "dwo");
  TensorBuffer x(alloc, t, {L, E}, Tag::kActivations, "x"), dy(alloc, t, {L, E}, Tag::kActivations, "dy");
  TensorBuffer y(alloc, t, {L, E}, Tag::kActivations, "y"), dx(alloc, t, {L, E}, Tag::kActivations, "dx");
  fill_hash_uniform_on(dev, wq, opts.seed, kWq, 0, ws);
  fill_hash_uniform_on(dev, wk, opts.seed, kWk, 0, ws);
  fill_hash_uniform_on(dev, wv, opts.seed, kWv, 0, ws);
  fill_hash_uniform_on(dev, wo, opts.seed, kWo, 0, wos);
  const TokenLayout layout = token_layout(run_cfg, static_cast<int>(C));
  fill_rows(dev, x, layout, comm.rank(), opts.seed, kX, cfg.seq);
  fill_rows(dev, dy, layout, comm.rank(), opts.seed, kDy, cfg.seq);
  AttentionWeights w{wq, wk, wv, wo};
  AttentionGrads g{dwq, dwk, dwv, dwo};
  AttentionSaved saved;
  saved.keep_last_stage = opts.keep_last;

  AttnRunResult r;
  r.stage_heads = block->stage_heads();
  r.device_name = dev.name();
  r.backend = comm.backend();
  r.padded_seq = run_cfg.seq;
  for (int i = 0; i < (opts.rehearsal ? 0 : opts.warmup); ++i) {
    block->forward(y, x, w, mask, saved);
    block->backward(dx, g, dy, x, w, saved);
  }
  // Every rank starts each phase together with its device idle; a GPU's clock is read only
  // after its stream has finished (synchronize is a no-op on the CPU).
  auto start_together = [&] {
    dev.synchronize();
    world.barrier();
    return now_ms();
  };
  const RingStats ring_before = block->ring_stats();
  alloc.set_watch({Tag::kAttnWorkspace, Tag::kCommunication});
  alloc.reset_peaks();
  alloc.set_phase(Phase::kForward);
  double t0 = start_together();
  block->forward(y, x, w, mask, saved);
  dev.synchronize();
  double fwd = now_ms() - t0;
  const int64_t fwd_inter = alloc.stats().watch_peak;
  alloc.set_phase(Phase::kBackward);
  t0 = start_together();
  block->backward(dx, g, dy, x, w, saved);
  dev.synchronize();
  double bwd = now_ms() - t0;
  alloc.set_phase(Phase::kSetup);
  const MemoryStats m = alloc.stats();
  world.all_reduce(&fwd, &fwd, 1, DType::kF64, ReduceOp::kMax);
  world.all_reduce(&bwd, &bwd, 1, DType::kF64, ReduceOp::kMax);
  r.fwd_ms = fwd;
  r.bwd_ms = bwd;
  r.mem = reduce_max(world, m);
  r.intermediates_fwd = reduce_max(world, fwd_inter);
  r.intermediates_bwd = reduce_max(world, m.phase_watch_peak[static_cast<int>(Phase::kBackward)]);
  r.reserved_peak = reduce_max(world, alloc.reserved_peak_bytes());
  const RingStats ring_after = block->ring_stats();
  r.ring = RingStats{.exchanges = ring_after.exchanges - ring_before.exchanges,
                     .bytes_sent = ring_after.bytes_sent - ring_before.bytes_sent,
                     .wait_s = ring_after.wait_s - ring_before.wait_s,
                     .compute_s = ring_after.compute_s - ring_before.compute_s};
  r.ring_compute_min_s = r.ring.compute_s;
  world.all_reduce(&r.ring.wait_s, &r.ring.wait_s, 1, DType::kF64, ReduceOp::kMax);
  world.all_reduce(&r.ring.compute_s, &r.ring.compute_s, 1, DType::kF64, ReduceOp::kMax);
  world.all_reduce(&r.ring_compute_min_s, &r.ring_compute_min_s, 1, DType::kF64, ReduceOp::kMin);

  if (!opts.dump_dir.empty() && !opts.rehearsal) {
    const int64_t S = cfg.seq;  // the real rows: the padding is dropped
    auto gx = gather_rows(world, dev, x, layout), gdy = gather_rows(world, dev, dy, layout),
         gy = gather_rows(world, dev, y, layout), gdx = gather_rows(world, dev, dx, layout);
    for (auto* v : {&gx, &gdy, &gy, &gdx}) v->resize(static_cast<size_t>(S * E));
    auto sq = sum_over_ranks(world, dev, dwq), sk = sum_over_ranks(world, dev, dwk),
         sv = sum_over_ranks(world, dev, dwv), so = sum_over_ranks(world, dev, dwo);
    if (world.rank() == 0) {
      const std::string& d = opts.dump_dir;
      write(d, "x.npy", {S, E}, gx);
      write(d, "dy.npy", {S, E}, gdy);
      write(d, "y.npy", {S, E}, gy);
      write(d, "dx.npy", {S, E}, gdx);
      write(d, "wq.npy", {HD, E}, host_f32(dev, wq));
      write(d, "wk.npy", {GD, E}, host_f32(dev, wk));
      write(d, "wv.npy", {GD, E}, host_f32(dev, wv));
      write(d, "wo.npy", {E, HD}, host_f32(dev, wo));
      write(d, "dwq.npy", {HD, E}, sq);
      write(d, "dwk.npy", {GD, E}, sk);
      write(d, "dwv.npy", {GD, E}, sv);
      write(d, "dwo.npy", {E, HD}, so);
      // What reference/check_attn_dump.py needs to recompute the block (rope_theta at full
      // precision: JSON numbers are written to round-trip).
      Json meta;
      meta["strategy"] = strategy_name(cfg.strategy);
      meta["ranks"] = C;
      meta["seq"] = S;
      meta["hidden"] = E;
      meta["heads"] = cfg.heads;
      meta["kv_heads"] = cfg.kv_heads;
      meta["head_dim"] = cfg.head_dim;
      meta["upipe_heads"] = r.stage_heads;
      meta["ring"] = ring_degree(cfg, static_cast<int>(C));
      meta["dtype"] = dtype_name(t);
      meta["rope_theta"] = cfg.rope_theta;
      meta["rope"] = "hf_rotate_half";
      meta["positions"] = "global, 0..seq-1, restarting at 0 at each document start";
      meta["causal"] = true;
      meta["doc_lens"] = real_mask.lengths();
      meta["window"] = opts.window;
      meta["padded_seq"] = run_cfg.seq;
      meta["gqa"] = "query head h uses kv head h / (heads / kv_heads)";
      meta["seed"] = opts.seed;
      meta["weight_layout"] =
          "wq (heads*head_dim, hidden), wk/wv (kv_heads*head_dim, hidden), wo (hidden, heads*head_dim); y = attn @ wo.T";
      meta["weight_grads"] = "summed over ranks";
      meta["storage_values"] = "float32 copies of the " + std::string(dtype_name(t)) + " values";
      FILE* f = std::fopen((d + "/meta.json").c_str(), "w");
      UNTIED_CHECK_KIND(ErrorKind::kIo, f != nullptr, "cannot write ", d, "/meta.json");
      const bool written = std::fprintf(f, "%s\n", json_line(meta).c_str()) > 0;
      UNTIED_CHECK_KIND(ErrorKind::kIo, std::fclose(f) == 0 && written, "cannot write ", d, "/meta.json");
    }
    world.barrier();
  }
  return r;
}

}  // namespace untied::cli

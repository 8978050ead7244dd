// The training loop: see trainer.h.
#include "untied/train/trainer.h"
#include "untied/train/rank_sample.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "untied/attention/head_schedule.h"
#include "untied/comm/watchdog.h"
#include "untied/core/file_io.h"
#include "untied/core/json.h"
#include "untied/kernels/adamw.h"
#include "untied/train/checkpoint.h"
#include "untied/train/fault.h"
#include "untied/train/hf_weights.h"
#include "untied/train/memory_plan.h"
#include "untied/dist/sharded_params.h"

namespace untied {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What must match for a checkpoint to be resumed.
std::string identity(const TrainOptions& o, int ranks, const DataSource& data) {
  const ModelConfig& m = o.model;
  return str_cat("batch=", o.batch, " model ", m.name, " ", model_identity(m), " strategy=", strategy_name(o.decoder.strategy),
                 o.decoder.ring > 1 ? str_cat(" ring=", o.decoder.ring) : std::string(),
                 " seq=", o.decoder.seq, o.window > 0 ? str_cat(" window=", o.window) : std::string(), o.doc_mask ? "" : " no_doc_mask", " ranks=", ranks, " dtype=", dtype_name(o.decoder.dtype), " seed=", o.seed,
                 " data=", data.kind(), " data_vocab=", data.vocab_size());
}

// The settings a resumed run may change (the optimizer's schedule), as DIR/run.json records them.
Json run_settings(const TrainOptions& o) {
  return Json{{"steps", o.steps}, {"lr", as_printed("%.6g", o.lr)}, {"min_lr_ratio", as_printed("%.6g", o.min_lr_ratio)},
              {"warmup", o.warmup}, {"weight_decay", as_printed("%.6g", o.weight_decay)},
              {"clip", as_printed("%.6g", o.clip)}};
}

// On resume: says which of run_settings differ from the checkpoint's run (allowed).
void say_changed_settings(const TrainOptions& o) {
  std::ifstream f(o.checkpoint_dir + "/run.json");
  if (!f) return;
  std::stringstream ss;
  ss << f.rdbuf();
  const Json was = Json::parse(ss.str(), nullptr, false), now = run_settings(o);
  if (!was.is_object()) return;
  std::string changes;
  for (const auto& [key, value] : now.items())
    if (was.contains(key) && was[key] != value)
      changes += (changes.empty() ? "" : ", ") + key + " " + was[key].dump() + " -> " + value.dump();
  if (!changes.empty())
    std::fprintf(stderr, "untied train: resuming with changed settings (allowed; the schedule follows them from here): %s\n",
                 changes.c_str());
}

// Rewrites a metrics file keeping the lines of steps <= step (atomically: a temporary renamed
// over it); a missing file is fine (nothing to keep).
Status keep_metrics_through(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return Status::ok_status();
  std::stringstream kept;
  std::string line;
  while (std::getline(in, line)) {
    const Json j = Json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > step) continue;
    kept << line << "\n";
  }
  if (!write_file_atomically(path, kept.str())) return Status::io_error("cannot rewrite the metrics file " + path);
  return Status::ok_status();
}

std::string format_duration(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}

// One step's figures, as its metrics line gives them (times in seconds here, ms in the line).
struct StepMetrics {
  int64_t step = 0;
  double loss = 0, accuracy = -1;  // accuracy < 0: the data has no answers (null)
  double lr = 0, grad_norm = 0, tokens_per_s_per_rank = 0;
  double step_s = 0, data_s = 0, forward_backward_s = 0, optimizer_s = 0;
  const MemoryStats* mem = nullptr;  // peaks since the start of the run, max over ranks
  const OpTimes* ops = nullptr;      // rank 0's kernel ops in this step; null: none timed (a GPU, rehearsal)
};

std::string metrics_line(const StepMetrics& m) {
  Json j;
  j["step"] = m.step;
  j["loss"] = as_printed("%.6f", m.loss);
  j["accuracy"] = m.accuracy >= 0 ? Json(as_printed("%f", m.accuracy)) : Json(nullptr);
  j["lr"] = as_printed("%.6g", m.lr);
  j["grad_norm"] = as_printed("%.6g", m.grad_norm);
  j["tokens_per_s_per_rank"] = as_printed("%.1f", m.tokens_per_s_per_rank);
  j["step_ms"] = as_printed("%.2f", m.step_s * 1e3);
  j["phase_ms"] = Json{{"data", as_printed("%.2f", m.data_s * 1e3)},
                       {"forward_backward", as_printed("%.2f", m.forward_backward_s * 1e3)},
                       {"optimizer", as_printed("%.2f", m.optimizer_s * 1e3)}};
  if (m.ops != nullptr) {  // rank 0's own time in each kernel op this step; the rest is communication and glue
    Json ops = Json::object();
    for (const auto& [name, sec] : m.ops->seconds) ops[std::string(name)] = as_printed("%.2f", sec * 1e3);
    j["op_ms"] = ops;
  }
  j["peak_bytes_by_tag"] = peak_bytes_by_tag(*m.mem);
  return json_line(j);
}

}  // namespace

float learning_rate(const TrainOptions& o, int64_t s) {
  if (o.warmup > 0 && s < o.warmup) return o.lr * static_cast<float>(s + 1) / static_cast<float>(o.warmup);
  const int64_t span = std::max<int64_t>(1, o.steps - o.warmup);
  const double p = std::min(1.0, static_cast<double>(s - o.warmup) / static_cast<double>(span));
  const double min_lr = o.lr * o.min_lr_ratio;
  return static_cast<float>(min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * p)));
}

Status validate(const TrainOptions& o, int ranks) {
  Status s = validate(o.model, o.decoder, ranks);
  if (!s.ok()) return s;
  if (o.steps < 1) return Status::invalid_argument("--steps must be >= 1");
  if (o.batch < 1) return Status::invalid_argument("--batch must be >= 1");
  if (!(o.lr > 0) || !(o.min_lr_ratio >= 0) || o.min_lr_ratio > 1)
    return Status::invalid_argument("--lr must be > 0 and --min-lr-ratio in [0, 1]");
  if (o.warmup < 0 || o.save_every < 0 || o.stop_after < 0 || o.keep < 0 || o.skip_nonfinite < 0)
    return Status::invalid_argument("--warmup, --save-every, --stop-after, --keep and --skip-nonfinite must be >= 0");
  if (!(o.clip >= 0) || !(o.weight_decay >= 0)) return Status::invalid_argument("--clip and --weight-decay must be >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 && o.eps > 0))
    return Status::invalid_argument("AdamW needs 0 <= beta1, beta2 < 1 and eps > 0");
  if (o.resume && o.checkpoint_dir.empty()) return Status::invalid_argument("--resume needs --checkpoint-dir");
  if (o.rehearsal && (o.resume || !o.checkpoint_dir.empty()))
    return Status::invalid_argument("a rehearsal has no weights to save or load: drop --checkpoint-dir and --resume");
  if (o.threads < 1) return Status::invalid_argument("--threads must be >= 1");
  if (o.host_budget_bytes < 0 || o.ranks_per_node < 1)
    return Status::invalid_argument("--host-budget must be >= 0 and the ranks per node >= 1");
  if (o.host_budget_bytes > 0) {
    const int64_t need = host_bytes(o, ranks), share = o.host_budget_bytes / o.ranks_per_node;
    const int64_t grads = need - offloaded_input_bytes(o, ranks);
    if (need > share)
      return Status::invalid_argument(
          "the offloaded block inputs" +
          (grads > 0 ? " and one block's gradients and attention output waiting there (" + format_bytes(grads) + ")" : std::string()) +
          " need " + format_bytes(need) + " of host memory per rank (" +
          std::to_string(offloaded_inputs(o.model, o.decoder)) + " blocks of " +
          std::to_string(padded_config(attention_config(o.model, o.decoder), ranks).seq / ranks) + " x " +
          std::to_string(o.model.hidden) + " " + std::string(dtype_name(o.decoder.dtype)) + "), " +
          format_bytes(need * o.ranks_per_node) + " per node of " + std::to_string(o.ranks_per_node) +
          " ranks, over --host-budget " + format_bytes(o.host_budget_bytes) +
          ": offload fewer blocks (--keep-inputs K, --offload-every N), shorten --seq, or raise --host-budget");
  }
  return Status::ok_status();
}

int64_t offloaded_input_bytes(const TrainOptions& o, int ranks) {
  if (!o.offload_inputs) return 0;
  const int64_t L = padded_config(attention_config(o.model, o.decoder), ranks).seq / ranks;
  return offloaded_inputs(o.model, o.decoder) * L * o.model.hidden * dtype_size(o.decoder.dtype);
}

int64_t grad_stash_bytes(const TrainOptions& o, int ranks) {
  const DecoderOptions& d = o.decoder;
  const AttentionConfig ac = padded_config(attention_config(o.model, d), ranks);
  if (!host_parts(o.model, d, ac.seq / ranks, o.offload_inputs).grads || d.strategy == Strategy::kLocal) return 0;
  const TokenLayout layout = token_layout(ac, ranks);
  const HeadSchedule sched =
      make_head_schedule(ac.heads, ac.kv_heads, layout.group(), stage_heads_of(ac, ranks)).value();
  const int64_t rounds = sched.stages / sched.stages_per_round;
  return layout.group_tokens() * (sched.stages * sched.q_per_rank + 2 * rounds * sched.kv_per_rank) *
         o.model.head_dim * dtype_size(d.dtype);
}

int64_t dh_host_bytes(const TrainOptions& o, int ranks) {
  const DecoderOptions& d = o.decoder;
  const int64_t L = padded_config(attention_config(o.model, d), ranks).seq / ranks;
  if (!host_parts(o.model, d, L, o.offload_inputs).dh) return 0;
  return L * o.model.hidden * dtype_size(d.dtype);
}

int64_t attn_out_host_bytes(const TrainOptions& o, int ranks) {
  const DecoderOptions& d = o.decoder;
  const int64_t L = padded_config(attention_config(o.model, d), ranks).seq / ranks;
  if (!host_parts(o.model, d, L, o.offload_inputs).attn_out) return 0;
  return L * o.model.heads * o.model.head_dim * dtype_size(d.dtype);
}

int64_t host_bytes(const TrainOptions& o, int ranks) {
  // A block's saved output is freed as its backward begins (D computed), the kept gradients come
  // after: they overlap only with dhm.
  // With Recompute::kSelective every block's output waits there from its forward on: the other
  // N - 1 blocks' are beside the one in use.
  const int64_t a = attn_out_host_bytes(o, ranks);
  return offloaded_input_bytes(o, ranks) + dh_host_bytes(o, ranks) + kept_outputs_host_bytes(o, ranks) +
         std::max(grad_stash_bytes(o, ranks), a);
}

int64_t kept_outputs_host_bytes(const TrainOptions& o, int ranks) {
  if (o.decoder.recompute != Recompute::kSelective) return 0;
  return (o.model.layers - 1) * attn_out_host_bytes(o, ranks);
}

DecoderOptions resolved_decoder_options(const TrainOptions& o, int ranks) {
  DecoderOptions d = o.decoder;
  // A selective recompute projects none of upipe's stages: there is no last stage to keep.
  if (d.recompute == Recompute::kSelective) d.keep_last_stage = KeepLastStage::kOff;
  if (d.strategy == Strategy::kUPipe && d.keep_last_stage == KeepLastStage::kAuto) {
    // Where the closed forms do not cover the run (a window), memory first: not kept.
    const bool keep = validate_plan(o, ranks).ok() && plan_memory(o, ranks).keeps_last_stage;
    d.keep_last_stage = keep ? KeepLastStage::kOn : KeepLastStage::kOff;
  }
  return d;
}

RecomputeChoice choose_recompute(const TrainOptions& o, int ranks, const MachineMemory& machine) {
  if (o.decoder.recompute != Recompute::kAuto) return {o.decoder.recompute, ""};
  auto full = [](const std::string& why) { return RecomputeChoice{Recompute::kFull, "full (auto: " + why + ")"}; };
  if (o.decoder.keep_last_stage == KeepLastStage::kOn)
    return full("--upipe-keep-last on keeps a stage that only a full recompute projects");
  TrainOptions sel = o;
  sel.decoder.recompute = Recompute::kSelective;
  sel.host_budget_bytes = 0;  // (weighed below, beside the other limits)
  if (!validate_plan(sel, ranks).ok())
    return full("the memory plan does not cover this run, and nothing is kept that it has not counted");
  const int64_t device = plan_memory(sel, ranks).peak_total(), host = host_bytes(sel, ranks);
  struct Limit {
    int64_t need, have;
    std::string what;
  };
  std::vector<Limit> limits;
  if (o.budget_bytes > 0) limits.push_back({device, o.budget_bytes, "--mem-budget"});
  if (o.host_budget_bytes > 0)
    limits.push_back({host, o.host_budget_bytes / o.ranks_per_node, "the rank's share of --host-budget"});
  if (machine.shared && machine.host > 0) {
    limits.push_back({device + host, machine.host, "the rank's share of this machine's memory"});
  } else {
    if (machine.device > 0) limits.push_back({device, machine.device, "the rank's share of its device's free memory"});
    if (machine.host > 0) limits.push_back({host, machine.host, "the rank's share of its host's memory"});
  }
  for (const Limit& l : limits)
    if (l.need > l.have)
      return full("selective's planned " + format_bytes(l.need) + " per rank is over " + l.what + ", " +
                  format_bytes(l.have));
  if (limits.empty()) return full("no budget or machine memory to weigh selective's against: memory first");
  // The limit with the least room left says how close it is.
  const Limit& tight = *std::min_element(limits.begin(), limits.end(), [](const Limit& a, const Limit& b) {
    return static_cast<double>(a.have - a.need) / a.have < static_cast<double>(b.have - b.need) / b.have;
  });
  return {Recompute::kSelective, "selective (auto: its planned " + format_bytes(tight.need) + " per rank fit in " +
                                     tight.what + ", " + format_bytes(tight.have) + ")"};
}

StatusOr<TrainSummary> train(Communicator& comm, const DataSource& data, const TrainOptions& o) {
  Status vs = validate(o, comm.size());  // before the device takes o.threads
  if (!vs.ok()) return vs;
  auto dev = make_cpu_device(
      CpuDeviceOptions{.threads = o.threads, .budget_bytes = o.budget_bytes, .rehearsal = o.rehearsal});
  return train(*dev, comm, comm, data, o);
}

StatusOr<TrainSummary> train(Device& dev, Communicator& dev_comm, Communicator& comm, const DataSource& data,
                             const TrainOptions& o) {
  UNTIED_CHECK(dev_comm.size() == comm.size() && dev_comm.rank() == comm.rank(),
               "train: the device communicator must have the ranks of the host one");
  Status vs = validate(o, comm.size());
  if (!vs.ok()) return vs;
  if (data.vocab_size() > o.model.vocab)
    return Status::invalid_argument("the data's vocabulary (" + std::to_string(data.vocab_size()) +
                                    ") is larger than the model's (" + std::to_string(o.model.vocab) + ")");
  Allocator& alloc = dev.allocator();
  ShardedParams params(dev, dev_comm, parameter_descriptors(o.model), o.decoder.dtype);
  params.init(parameter_init(o.model, o.seed));
  if (!o.hf_model.empty() && !o.resume) {  // every rank opens and checks the files, then reads its shards
    auto w = HfWeights::open(o.hf_model);
    Status ws = w.ok() ? w.value().check(o.model) : w.status();
    if (ws.ok() && dev.backed()) ws = load_hf_weights(w.value(), params);
    ws = first_failure(comm, ws);
    if (!ws.ok()) return ws;
  }
  // Offloaded block inputs live in host memory (page-locked on a GPU): counted apart from the
  // device budget.
  Allocator host(o.rehearsal || !dev.backed() ? make_counting_memory() : dev.host_memory(),
                 Allocator::Options{.budget_bytes = o.host_budget_bytes / o.ranks_per_node, .name = "host"});
  Decoder decoder(dev, dev_comm, o.model, resolved_decoder_options(o, comm.size()), o.offload_inputs ? &host : nullptr);
  const std::string id = identity(o, comm.size(), data);

  int64_t start = 0;
  if (o.resume) {
    auto step = load_checkpoint(comm, o.checkpoint_dir, id, params);
    if (!step.ok()) return step.status();
    start = step.value();
    if (comm.rank() == 0) say_changed_settings(o);
  } else if (!o.checkpoint_dir.empty()) {
    // Any rank seeing a checkpoint there refuses for all (ranks may see different filesystems).
    const Status es = checkpoint_exists(o.checkpoint_dir)
                          ? Status::invalid_argument("--checkpoint-dir " + o.checkpoint_dir +
                                                     " already holds a checkpoint: pass --resume to continue it, or "
                                                     "choose a new directory")
                          : Status::ok_status();
    const Status all = first_failure(comm, es);
    if (!all.ok()) return all;
  }

  // Before any step: the model's config.json beside the checkpoints (for `untied eval` and
  // `untied export`), and a --save-hf directory that holds no model yet (its old shards would
  // otherwise be read in place of the new file).
  {
    Status cs;
    if (comm.rank() == 0 && !o.checkpoint_dir.empty() && !o.rehearsal)
      cs = write_hf_config(o.checkpoint_dir, o.model,
                           SaveHfOptions{.max_position = std::max<int64_t>(o.decoder.seq, 4096),
                                         .source_config = o.hf_model.empty() ? "" : o.hf_model + "/config.json"});
    if (cs.ok() && comm.rank() == 0 && !o.save_hf.empty()) cs = check_hf_output_dir(o.save_hf, "--save-hf");
    cs = first_failure(comm, cs);
    if (!cs.ok()) return cs;
  }

  // A resumed run's metrics continue the file from the checkpoint's step: the lines of later
  // steps (written before an interruption) are dropped first, so no step appears twice.
  FILE* metrics = nullptr;
  Status ms;
  if (comm.rank() == 0 && !o.metrics_path.empty()) {
    if (start > 0) ms = keep_metrics_through(o.metrics_path, start);
    if (ms.ok()) metrics = std::fopen(o.metrics_path.c_str(), start > 0 ? "a" : "w");
    if (ms.ok() && metrics == nullptr) ms = Status::io_error("cannot write the metrics file " + o.metrics_path);
  }
  ms = first_failure(comm, ms);
  if (!ms.ok()) return ms;
  const Fault fault = fault_from_environment(comm.rank());
  int64_t skipped = 0;  // non-finite steps skipped (skip_nonfinite)

  // S real tokens per sequence, run as Sp (padded to what the ranks divide: the padding is one
  // more document, with no labels).
  const int64_t S = o.decoder.seq, Sp = decoder.padded_seq(), L = Sp / comm.size();
  const int64_t B = o.batch;
  // The positions this rank holds: one run, or two with a ring (token_layout.h).
  const std::vector<TokenSegment> positions =
      token_layout(padded_config(attention_config(o.model, o.decoder), comm.size()), comm.size())
          .rank_segments(comm.rank());
  // This rank's positions of the step's sequences, on the host (the decoder copies ids and labels
  // to the device).
  std::vector<int32_t> tokens(static_cast<size_t>(B * L)), labels(tokens.size());
  std::vector<uint8_t> answer(tokens.size());
  const SampleShape shape{.seq = S, .padded_seq = Sp, .window = o.window, .doc_mask = o.doc_mask};

  // Each kernel op's time per step, for the metrics (CPU ranks); unset when train returns.
  OpTimes op_times;
  struct OpTimesGuard {
    Device& dev;
    ~OpTimesGuard() { dev.op_times = nullptr; }
  } op_times_guard{dev};
  dev.op_times = &op_times;

  TrainSummary sum;
  sum.first_step = start;
  const int64_t end = o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps;
  const double t_begin = now_s();
  for (int64_t s = start; s < end; ++s) {
    watchdog_note(0, "step " + std::to_string(s + 1));
    watchdog_note(1, "data");
    fault_at_step_start(fault, s + 1, comm);  // tests only
    if (fault.kind == FaultKind::kNanWeight && fault.step == s + 1 && dev.backed()) {  // tests only
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const int i = std::min(fault.param, params.num_params() - 1);
      if (params.owned_elems(i) > 0) dev.copy(params.master(i), &nan, sizeof nan);
    }
    op_times.seconds.clear();
    const double t0 = now_s();
    Status ds;
    std::vector<SequenceMask> masks(static_cast<size_t>(B), SequenceMask(S, o.window).padded_to(Sp));
    for (int64_t b = 0; b < B && ds.ok() && dev.backed(); ++b)
      ds = fill_rank_sample(data, s * B + b, shape, positions, tokens.data() + b * L, labels.data() + b * L,
                            answer.data() + b * L, &masks[b]);
    ds = first_failure(comm, ds);
    if (!ds.ok()) {
      if (metrics) std::fclose(metrics);
      return ds;
    }
    int64_t count = dev.backed() ? 0 : B * L;  // rehearsal: no data, any positive count
    for (int64_t i = 0; i < B * L && dev.backed(); ++i) count += labels[i] != kIgnoreIndex;
    comm.all_reduce(&count, &count, 1, DType::kI64, ReduceOp::kSum);
    const double t1 = now_s();

    StepSums st;
    int64_t nan_sample = -1;  // the first micro-batch whose loss is not finite on this rank
    watchdog_note(1, "forward and backward");
    fault_before_forward(fault, s + 1, dev_comm);  // tests only
    for (int64_t b = 0; b < B; ++b) {
      const StepSums one =
          decoder.forward_backward(params, tokens.data() + b * L, labels.data() + b * L, answer.data() + b * L, count,
                                   masks[b]);
      if (!std::isfinite(one.loss_sum) && nan_sample < 0) nan_sample = b;
      st.loss_sum += one.loss_sum;
      st.answers += one.answers;
      st.correct += one.correct;
    }
    const double t2 = now_s();

    if (fault.kind == FaultKind::kNanGradient && fault.step == s + 1 && dev.backed()) {  // tests only
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const int i = std::min(fault.param, params.num_params() - 1);
      if (params.owned_elems(i) > 0) dev.copy(params.grad(i), &nan, sizeof nan);
    }
    if (fault.kind == FaultKind::kNanLoss && fault.step == s + 1) st.loss_sum = std::numeric_limits<double>::quiet_NaN();

    // Global gradient norm, clipping, AdamW.
    watchdog_note(1, "optimizer");
    alloc.set_phase(Phase::kOptimizer);
    std::vector<double> sq_of(static_cast<size_t>(params.num_params()));
    double sq = 0;
    for (int i = 0; i < params.num_params(); ++i) {
      sq_of[i] = grad_sum_squares(dev, params.grad(i), params.owned_elems(i));
      sq += sq_of[i];
    }
    double checks[2] = {sq, st.loss_sum};
    comm.all_reduce(checks, checks, 2, DType::kF64, ReduceOp::kSum);
    sq = checks[0];
    const double norm = std::sqrt(sq);
    if (!std::isfinite(checks[0]) || !std::isfinite(checks[1])) {
      // The first non-finite tensor over all ranks: the loss, else a parameter's gradient.
      int64_t first = params.num_params();
      for (int i = 0; i < params.num_params() && first == params.num_params(); ++i)
        if (!std::isfinite(sq_of[i])) first = i;
      comm.all_reduce(&first, &first, 1, DType::kI64, ReduceOp::kMin);
      std::string what = first < params.num_params() ? "the gradient of " + params.desc(static_cast<int>(first)).name
                                                     : "the gradient norm (it overflowed)";
      if (!std::isfinite(checks[1])) {  // the forward: which activation went first
        int64_t b = nan_sample < 0 ? B : nan_sample;
        comm.all_reduce(&b, &b, 1, DType::kI64, ReduceOp::kMin);
        const std::string act =
            b < B ? decoder.first_nonfinite_activation(params, tokens.data() + b * L, masks[static_cast<size_t>(b)])
                  : std::string();
        what = act.empty() ? "the loss" : "the loss (the first non-finite activation: " + act + ")";
      }
      params.zero_grads();
      alloc.set_phase(Phase::kSetup);
      if (skipped < o.skip_nonfinite) {
        ++skipped;
        if (comm.rank() == 0)
          std::fprintf(stderr, "untied train: step %lld: %s is not finite; the update is skipped (%lld of %lld "
                               "allowed by --skip-nonfinite)\n",
                       (long long)(s + 1), what.c_str(), (long long)skipped, (long long)o.skip_nonfinite);
        if (metrics) {
          Json j;
          j["step"] = s + 1;
          j["skipped"] = true;
          j["loss"] = as_printed("%.6f", count > 0 ? checks[1] / count : 0.0);
          j["grad_norm"] = as_printed("%.6g", norm);
          j["nonfinite"] = what;
          std::fprintf(metrics, "%s\n", json_line(j).c_str());
          std::fflush(metrics);
        }
        continue;
      }
      if (metrics) std::fclose(metrics);
      return Status::invalid_argument(
          "step " + std::to_string(s + 1) + ": " + what + " is not finite (NaN or Inf); training stopped before the "
          "update, and " + (o.checkpoint_dir.empty() ? std::string("no checkpoint was asked for")
                                                     : "the last checkpoint in " + o.checkpoint_dir + " is kept") +
          ". Lower --lr, raise --warmup, use --clip, or pass --skip-nonfinite N to skip up to N such steps");
    }
    const float scale = o.clip > 0 && norm > o.clip ? static_cast<float>(o.clip / norm) : 1.0f;
    const float lr = learning_rate(o, s);
    for (int i = 0; i < params.num_params(); ++i) {
      if (scale != 1.0f) scale_in_place(dev, params.grad(i), params.owned_elems(i), scale);
      adamw_step(dev, params.master(i), params.moment1(i), params.moment2(i), params.grad(i), params.owned_elems(i),
                 AdamWParams{.lr = lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps,
                             .weight_decay = o.weight_decay, .step = s + 1, .decay = params.desc(i).decay});
    }
    params.zero_grads();
    alloc.set_phase(Phase::kSetup);
    const double t3 = now_s();

    double vals[4] = {st.loss_sum, static_cast<double>(st.answers), static_cast<double>(st.correct), 0};
    comm.all_reduce(vals, vals, 3, DType::kF64, ReduceOp::kSum);
    const double loss = count > 0 ? vals[0] / count : 0.0;
    const double acc = vals[1] > 0 ? vals[2] / vals[1] : -1.0;
    MemoryStats mem = alloc.stats();  // peaks since the start of the run
    for (auto& p : mem.peak) comm.all_reduce(&p, &p, 1, DType::kI64, ReduceOp::kMax);
    comm.all_reduce(&mem.peak_total, &mem.peak_total, 1, DType::kI64, ReduceOp::kMax);
    sum.peak = mem;
    sum.live_at_peak = alloc.live_at_peak();
    sum.host_peak = host.stats().peak_total;
    comm.all_reduce(&sum.host_peak, &sum.host_peak, 1, DType::kI64, ReduceOp::kMax);
    double step_s = t3 - t0;
    comm.all_reduce(&step_s, &step_s, 1, DType::kF64, ReduceOp::kMax);
    sum.losses.push_back(loss);
    if (s == start) sum.first_loss = loss;
    sum.last_loss = loss;
    sum.last_accuracy = acc;
    sum.last_step = s + 1;

    if (comm.rank() == 0) {
      const double tps = static_cast<double>(S * B) / (step_s * comm.size());
      if (metrics) {
        const std::string line = metrics_line(StepMetrics{
            .step = s + 1, .loss = loss, .accuracy = acc, .lr = lr, .grad_norm = norm, .tokens_per_s_per_rank = tps,
            .step_s = step_s, .data_s = t1 - t0, .forward_backward_s = t2 - t1, .optimizer_s = t3 - t2, .mem = &mem,
            .ops = op_times.seconds.empty() ? nullptr : &op_times});
        std::fprintf(metrics, "%s\n", line.c_str());
        std::fflush(metrics);
      }
      // Progress: a bar redrawn in place on a terminal; otherwise about 20 plain lines per run.
      const int64_t done = s + 1 - start, total = end - start;
      const bool tty = ::isatty(2) != 0;
      if (o.progress && (tty || done == total || done % std::max<int64_t>(1, total / 20) == 0)) {
        const double eta = (now_s() - t_begin) / done * (total - done);
        const int width = 24, fill = static_cast<int>(width * (s + 1) / o.steps);
        std::fprintf(stderr, "%sstep %lld/%lld [%s%s] loss %.4f%s | %.0f tok/s/rank | ETA %s%s", tty ? "\r" : "",
                     (long long)(s + 1), (long long)o.steps, std::string(fill, '=').c_str(),
                     std::string(width - fill, ' ').c_str(), loss,
                     acc >= 0 ? (" | answer acc " + std::to_string(acc).substr(0, 5)).c_str() : "", tps,
                     format_duration(eta).c_str(), tty && done != total ? "   " : "\n");
      }
    }
    const bool last = s + 1 == end;
    if (!o.checkpoint_dir.empty() && (last || (o.save_every > 0 && (s + 1) % o.save_every == 0))) {
      watchdog_note(1, "checkpoint save");
      Status cs = save_checkpoint(comm, o.checkpoint_dir, s + 1, id, params);
      if (cs.ok() && comm.rank() == 0) {  // the schedule's settings, for a resume to compare with
        const std::string run = o.checkpoint_dir + "/run.json";
        if (!write_file_atomically(run, run_settings(o).dump(2) + "\n")) cs = Status::io_error("cannot write " + run);
      }
      if (cs.ok() && o.keep > 0 && comm.rank() == 0) cs = remove_old_checkpoints(o.checkpoint_dir, o.keep);
      cs = first_failure(comm, cs);
      if (!cs.ok()) {
        if (metrics) std::fclose(metrics);
        return cs;
      }
    }
  }
  if (metrics) std::fclose(metrics);
  if (!o.save_hf.empty() && dev.backed()) {  // the trained model as a Hugging Face directory
    dev.synchronize();
    const Status hs = save_hf_model(o.save_hf, params, comm, o.model,
                                    SaveHfOptions{.max_position = std::max<int64_t>(o.decoder.seq, 4096),
                                                  .source_config = o.hf_model.empty() ? "" : o.hf_model + "/config.json",
                                                  .dtype = o.save_hf_dtype});
    if (!hs.ok()) return hs;
  }
  return sum;
}

}  // namespace untied

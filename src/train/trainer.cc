// The training loop (trainer.h). train() reads as the run it makes, each line a named step below:
//   resolve the options' autos                        resolve_run
//   the sharded model, its weights and the Decoder    load_initial_weights
//   where the run starts, what it writes              start_step, prepare_outputs, open_metrics
//   per step:
//     this rank's positions of the batch's sequences   StepBatch::load, StepBatch::labelled
//     forward and backward, gradients added            forward_backward
//     the global gradient norm (and the loss)          grad_norm; when not finite, first_nonfinite
//                                                      and skip_nonfinite (skipped, or stopped)
//     clipping and AdamW on the shards                 adamw_update
//     the step's figures over the ranks                agree_figures -> record_step, metrics_line,
//                                                      Progress
//     a stop asked for (a signal) on any rank           agree_stop: this step is the last
//     a checkpoint when due (or stopping)              save
//   the model as a Hugging Face directory              save_hf (not when stopped early)
// Every collective is called by every rank in the same order; a Status that the user can act on
// is the same on every rank (first_failure).
#include "untied/train/trainer.h"

#include <algorithm>
#include <numeric>
#include <chrono>
#include <optional>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "untied/comm/watchdog.h"
#include "untied/core/file_io.h"
#include "untied/core/json.h"
#include "untied/kernels/adamw.h"
#include "untied/train/checkpoint.h"
#include "untied/train/fault.h"
#include "untied/train/hf_weights.h"
#include "untied/train/memory_plan.h"
#include "untied/train/metrics.h"
#include "untied/train/evaluator.h"
#include "untied/train/flops.h"
#include "untied/train/rank_sample.h"
#include "untied/train/tensorboard.h"
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
  auto text = read_regular_file(o.checkpoint_dir + "/run.json", int64_t{1} << 20, "the run's settings");
  if (!text.ok()) return;
  const Json was = Json::parse(text.value(), nullptr, false), now = run_settings(o);
  if (!was.is_object()) return;
  std::string changes;
  for (const auto& [key, value] : now.items())
    if (was.contains(key) && was[key] != value)
      changes += (changes.empty() ? "" : ", ") + key + " " + was[key].dump() + " -> " + value.dump();
  if (!changes.empty())
    std::fprintf(stderr, "untied train: resuming with changed settings (allowed; the schedule follows them from here): %s\n",
                 changes.c_str());
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
  if (o.resume_from < 0 || (o.resume_from > 0 && !o.resume))
    return Status::invalid_argument("--resume-from STEP picks the step --resume continues (>= 1)");
  if (o.rehearsal && (o.resume || !o.checkpoint_dir.empty()))
    return Status::invalid_argument("a rehearsal has no weights to save or load: drop --checkpoint-dir and --resume");
  if (o.threads < 1) return Status::invalid_argument("--threads must be >= 1");
  if (o.host_budget_bytes < 0 || o.ranks_per_node < 1)
    return Status::invalid_argument("--host-budget must be >= 0 and the ranks per node >= 1");
  if (o.host_budget_bytes > 0) {
    const HostMemory need = host_memory(o, ranks);
    const int64_t share = o.host_budget_bytes / o.ranks_per_node, beside = need.beside_inputs();
    const RunGeometry g = run_geometry(o, ranks);
    if (need.total() > share)
      return Status::invalid_argument(
          "the offloaded block inputs" +
          (beside > 0 ? " and one block's gradients and attention output waiting there (" + format_bytes(beside) + ")" : std::string()) +
          " need " + format_bytes(need.total()) + " of host memory per rank (" + std::to_string(g.offloaded_blocks) +
          " blocks of " + std::to_string(g.L) + " x " + std::to_string(g.E) + " " + std::string(dtype_name(g.dtype)) +
          "), " + format_bytes(need.total() * o.ranks_per_node) + " per node of " + std::to_string(o.ranks_per_node) +
          " ranks, over --host-budget " + format_bytes(o.host_budget_bytes) +
          ": offload fewer blocks (--keep-inputs K, --offload-every N), shorten --seq, or raise --host-budget");
  }
  return Status::ok_status();
}

RunGeometry run_geometry(const TrainOptions& o, int ranks) {
  return run_geometry(o.model, o.decoder, ranks, o.offload_inputs);
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
  const int64_t device = plan_memory(sel, ranks).peak_total(), host = host_memory(sel, ranks).total();
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

StatusOr<ResolvedRun> resolve_run(const TrainOptions& asked, int ranks, const MachineMemory& machine) {
  ResolvedRun r;
  r.o = asked;
  TrainOptions& o = r.o;
  if (o.decoder.recompute == Recompute::kAuto) {  // a real error first, as itself
    TrainOptions full = o;
    full.decoder.recompute = Recompute::kFull;
    if (Status s = validate(full, ranks); !s.ok()) return s;
    const RecomputeChoice c = choose_recompute(o, ranks, machine);
    o.decoder.recompute = c.recompute;
    r.recompute_why = c.why;
  }
  if (Status s = validate(o, ranks); !s.ok()) return s;
  // A selective recompute projects none of upipe's stages: there is no last stage to keep.
  if (o.decoder.recompute == Recompute::kSelective) o.decoder.keep_last_stage = KeepLastStage::kOff;
  if (o.decoder.strategy == Strategy::kUPipe && o.decoder.keep_last_stage == KeepLastStage::kAuto) {
    // Where the closed forms do not cover the run (a window), memory first: not kept.
    const bool keep = validate_plan(o, ranks).ok() && plan_memory(o, ranks).keeps_last_stage;
    o.decoder.keep_last_stage = keep ? KeepLastStage::kOn : KeepLastStage::kOff;
  }
  r.g = run_geometry(o, ranks);
  return r;
}

StatusOr<TrainSummary> train(Communicator& comm, const DataSource& data, const TrainOptions& o) {
  Status vs = validate(o, comm.size());  // before the device takes o.threads
  if (!vs.ok()) return vs;
  auto dev = make_cpu_device(
      CpuDeviceOptions{.threads = o.threads, .budget_bytes = o.budget_bytes, .rehearsal = o.rehearsal});
  return train(*dev, comm, comm, data, o);
}

namespace {

// ---- the steps of a run, in the order train() takes them ----------------------------------------

// The initial weights: the Hugging Face model's, when one is given and the run does not resume
// (every rank opens and checks the files, then reads its own shards); else the initialisation.
Status load_initial_weights(const TrainOptions& o, Device& dev, Communicator& comm, ShardedParams& params) {
  params.init(parameter_init(o.model, o.seed));
  if (o.hf_model.empty() || o.resume) return Status::ok_status();
  auto w = HfWeights::open(o.hf_model);
  Status s = w.ok() ? w.value().check(o.model) : w.status();
  if (s.ok() && dev.backed()) s = load_hf_weights(w.value(), params);
  return first_failure(comm, s);
}

// The step the run starts after: the resumed checkpoint's (its state loaded into params), or 0. A
// new run refuses a directory that holds a checkpoint, on every rank if any sees one (ranks may
// see different filesystems).
StatusOr<int64_t> start_step(const TrainOptions& o, Communicator& comm, const std::string& id, ShardedParams& params) {
  if (o.resume) {
    std::string notes;  // steps passed over (damaged), a resharding
    auto step = load_checkpoint(comm, o.checkpoint_dir, id, params, o.resume_from, &notes);
    if (step.ok() && comm.rank() == 0) {
      std::istringstream lines(notes);
      for (std::string line; std::getline(lines, line);) std::fprintf(stderr, "untied train: resume: %s\n", line.c_str());
      say_changed_settings(o);
    }
    return step;
  }
  if (o.checkpoint_dir.empty()) return int64_t{0};
  const Status s = checkpoint_exists(o.checkpoint_dir)
                       ? Status::invalid_argument("--checkpoint-dir " + o.checkpoint_dir +
                                                  " already holds a checkpoint: pass --resume to continue it, or "
                                                  "choose a new directory")
                       : Status::ok_status();
  if (Status all = first_failure(comm, s); !all.ok()) return all;
  return int64_t{0};
}

// Before any step: the model's config.json beside the checkpoints (for `untied eval` and `untied
// export`), and a --save-hf directory that holds no model yet (its old shards would otherwise be
// read in place of the new file).
Status prepare_outputs(const TrainOptions& o, Communicator& comm) {
  Status s;
  if (comm.rank() == 0 && !o.checkpoint_dir.empty() && !o.rehearsal)
    s = write_hf_config(o.checkpoint_dir, o.model,
                        SaveHfOptions{.max_position = std::max<int64_t>(o.decoder.seq, 4096),
                                      .source_config = o.hf_model.empty() ? "" : o.hf_model + "/config.json",
                                      .dtype = o.hf_model.empty() ? "F32" : "",
                                      .window = o.window});
  // The tokenizer travels with the checkpoints, so that `untied export` writes a complete directory.
  if (s.ok() && comm.rank() == 0 && !o.checkpoint_dir.empty() && !o.rehearsal && !o.hf_model.empty())
    s = copy_tokenizer_files(o.hf_model, o.checkpoint_dir);
  if (s.ok() && comm.rank() == 0 && !o.save_hf.empty()) s = check_hf_output_dir(o.save_hf, "--save-hf");
  if (s.ok() && comm.rank() == 0 && !o.save_hf.empty() && !o.rehearsal)
    s = check_hf_output_space(o.save_hf, o.model,
                              o.save_hf_dtype.empty() ? hf_dtype_of_config(o.hf_model + "/config.json") : o.save_hf_dtype,
                              "--save-hf");
  return first_failure(comm, s);
}

// Rank 0's metrics file (none elsewhere, or without --metrics); the open's error on every rank.
StatusOr<MetricsFile> open_metrics(const TrainOptions& o, Communicator& comm, int64_t start) {
  StatusOr<MetricsFile> m = MetricsFile();
  if (comm.rank() == 0 && !o.metrics_path.empty()) m = MetricsFile::open(o.metrics_path, start);
  if (Status all = first_failure(comm, m.ok() ? Status::ok_status() : m.status()); !all.ok()) return all;
  return m;
}

// This rank's share of one step's sequences, on the host (the decoder copies ids and labels to
// the device): its L positions of each of the batch's B sequences, and each sequence's mask.
struct StepBatch {
  StepBatch(const TrainOptions& o, const RunGeometry& g, int rank)
      : B(o.batch), L(g.L), positions(g.layout.rank_segments(rank)),
        shape{.seq = g.S, .padded_seq = g.Sp, .window = o.window, .doc_mask = o.doc_mask},
        tokens(static_cast<size_t>(B * L)), labels(tokens.size()), answer(tokens.size()) {}

  // Samples step*B .. step*B + B - 1 of the data (nothing in a rehearsal: no data is read).
  Status load(const DataSource& data, int64_t step, bool backed) {
    masks.assign(static_cast<size_t>(B), SequenceMask(shape.seq, shape.window).padded_to(shape.padded_seq));
    for (int64_t b = 0; b < B && backed; ++b)
      if (Status s = fill_rank_sample(data, step * B + b, shape, positions, token(b), label(b), answers(b), &masks[b]);
          !s.ok())
        return s;
    return Status::ok_status();
  }
  // The labelled tokens of the step over all ranks (collective); any positive count in a
  // rehearsal.
  int64_t labelled(Communicator& comm, bool backed) const {
    int64_t count = backed ? 0 : B * L;
    for (int64_t i = 0; i < B * L && backed; ++i) count += labels[i] != kIgnoreIndex;
    comm.all_reduce(&count, &count, 1, DType::kI64, ReduceOp::kSum);
    return count;
  }
  int32_t* token(int64_t b) { return tokens.data() + b * L; }
  int32_t* label(int64_t b) { return labels.data() + b * L; }
  uint8_t* answers(int64_t b) { return answer.data() + b * L; }

  const int64_t B, L;
  const std::vector<TokenSegment> positions;  // the rank's rows: one run, or two with a ring
  const SampleShape shape;
  std::vector<int32_t> tokens, labels;
  std::vector<uint8_t> answer;
  std::vector<SequenceMask> masks;
};

// The step's sums over its sequences on this rank, and the first sequence whose loss is not
// finite here (-1: none).
struct BatchSums {
  StepSums sums;
  int64_t nonfinite_sample = -1;
};

// Forward and backward of every sequence of the batch, their gradients added into params.
// A MoE model's load-balancing loss is the mean over the batch's sequences (router_aux, already
// the same on every rank) and its tokens per expert their sum.
BatchSums forward_backward(Decoder& decoder, ShardedParams& params, StepBatch& batch, int64_t count) {
  BatchSums r;
  for (int64_t b = 0; b < batch.B; ++b) {
    const StepSums one = decoder.forward_backward(params, batch.token(b), batch.label(b), batch.answers(b), count,
                                                  batch.masks[static_cast<size_t>(b)],
                                                  1.0 / static_cast<double>(batch.B));
    if (!std::isfinite(one.loss_sum) && r.nonfinite_sample < 0) r.nonfinite_sample = b;
    r.sums.loss_sum += one.loss_sum;
    r.sums.answers += one.answers;
    r.sums.correct += one.correct;
    r.sums.router_aux += one.router_aux;
    r.sums.moe_sent_bytes += one.moe_sent_bytes;
    r.sums.expert_load.resize(one.expert_load.size(), 0.0);
    for (size_t i = 0; i < one.expert_load.size(); ++i) r.sums.expert_load[i] += one.expert_load[i];
  }
  return r;
}

// The global gradient norm and the step's loss sum over all ranks (one all-reduce), and this
// rank's sum of squares of each parameter's gradient shard (to name a non-finite one).
struct GradNorm {
  double sum_squares = 0, norm = 0, loss_sum = 0;  // over all ranks
  std::vector<double> squares;                     // per parameter, this rank's
  bool finite() const { return std::isfinite(sum_squares) && std::isfinite(loss_sum); }
};

GradNorm grad_norm(Device& dev, Communicator& comm, const ShardedParams& params, double loss_sum) {
  GradNorm g;
  g.squares.resize(static_cast<size_t>(params.num_params()));
  double sums[2] = {0, loss_sum};
  for (int i = 0; i < params.num_params(); ++i) {
    g.squares[i] = grad_sum_squares(dev, params.grad(i), params.owned_elems(i));
    sums[0] += g.squares[i];
  }
  comm.all_reduce(sums, sums, 2, DType::kF64, ReduceOp::kSum);
  g.sum_squares = sums[0];
  g.norm = std::sqrt(sums[0]);
  g.loss_sum = sums[1];
  return g;
}

// For a step whose loss or gradient norm is not finite (collective): the first non-finite tensor
// over all ranks, as the messages name it: the loss (with the first activation that went), else
// a parameter's gradient.
std::string first_nonfinite(Communicator& comm, ShardedParams& params, Decoder& decoder, StepBatch& batch,
                            const GradNorm& g, int64_t nonfinite_sample) {
  int64_t first = params.num_params();
  for (int i = 0; i < params.num_params() && first == params.num_params(); ++i)
    if (!std::isfinite(g.squares[i])) first = i;
  comm.all_reduce(&first, &first, 1, DType::kI64, ReduceOp::kMin);
  if (std::isfinite(g.loss_sum))
    return first < params.num_params() ? "the gradient of " + params.desc(static_cast<int>(first)).name
                                       : "the gradient norm (it overflowed)";
  int64_t b = nonfinite_sample < 0 ? batch.B : nonfinite_sample;  // the forward: which activation went first
  comm.all_reduce(&b, &b, 1, DType::kI64, ReduceOp::kMin);
  const std::string act =
      b < batch.B ? decoder.first_nonfinite_activation(params, batch.token(b), batch.masks[static_cast<size_t>(b)])
                  : std::string();
  return act.empty() ? "the loss" : "the loss (the first non-finite activation: " + act + ")";
}

// Clipping to o.clip and one AdamW step (1-based `step`) on this rank's shards.
void adamw_update(Device& dev, const ShardedParams& params, const TrainOptions& o, float lr, int64_t step,
                  double norm) {
  const float scale = o.clip > 0 && norm > o.clip ? static_cast<float>(o.clip / norm) : 1.0f;
  for (int i = 0; i < params.num_params(); ++i) {
    if (scale != 1.0f) scale_in_place(dev, params.grad(i), params.owned_elems(i), scale);
    adamw_step(dev, params.master(i), params.moment1(i), params.moment2(i), params.grad(i), params.owned_elems(i),
               AdamWParams{.lr = lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
                           .step = step, .decay = params.desc(i).decay});
  }
}

// A step's figures agreed over the ranks (collective): its mean loss and answer accuracy, the
// memory peaks since the start (max over ranks), the slowest rank's time.
struct StepFigures {
  double loss = 0, accuracy = -1, step_s = 0;
  double router_aux = 0;  // a MoE model's coef * load-balancing loss (in `loss`)
  MemoryStats mem;
  int64_t host_peak = 0;
};

// Per MoE layer (by its block number): the fewest and most tokens any expert got this step, over
// every rank and sequence of the batch, and the mean.
Json expert_load_json(const ModelConfig& m, const std::vector<double>& load) {
  Json out = Json::object();
  size_t at = 0;
  for (int64_t l = 0; l < m.layers; ++l) {
    if (!moe_layer(m, l) || at + static_cast<size_t>(m.experts) > load.size()) continue;
    const auto first = load.begin() + static_cast<std::ptrdiff_t>(at), last = first + m.experts;
    out[std::to_string(l)] = Json{{"min", *std::min_element(first, last)},
                                  {"max", *std::max_element(first, last)},
                                  {"mean", std::accumulate(first, last, 0.0) / static_cast<double>(m.experts)}};
    at += static_cast<size_t>(m.experts);
  }
  return out;
}

StepFigures agree_figures(Communicator& comm, const Allocator& alloc, const Allocator& host, const StepSums& st,
                          int64_t count, double step_s) {
  StepFigures f;
  double vals[3] = {st.loss_sum, static_cast<double>(st.answers), static_cast<double>(st.correct)};
  comm.all_reduce(vals, vals, 3, DType::kF64, ReduceOp::kSum);
  f.loss = (count > 0 ? vals[0] / count : 0.0) + st.router_aux;  // router_aux: the same on every rank
  f.router_aux = st.router_aux;
  f.accuracy = vals[1] > 0 ? vals[2] / vals[1] : -1.0;
  f.mem = alloc.stats();
  for (auto& p : f.mem.peak) comm.all_reduce(&p, &p, 1, DType::kI64, ReduceOp::kMax);
  comm.all_reduce(&f.mem.peak_total, &f.mem.peak_total, 1, DType::kI64, ReduceOp::kMax);
  f.host_peak = host.stats().peak_total;
  comm.all_reduce(&f.host_peak, &f.host_peak, 1, DType::kI64, ReduceOp::kMax);
  f.step_s = step_s;
  comm.all_reduce(&f.step_s, &f.step_s, 1, DType::kF64, ReduceOp::kMax);
  return f;
}

// The state at `step` (1-based) into the checkpoint directory, with the schedule's settings
// beside it (for a resume to compare with) and only the newest o.keep kept; the same Status on
// every rank.
Status save(const TrainOptions& o, Communicator& comm, int64_t step, const std::string& id, ShardedParams& params) {
  watchdog_note(1, "checkpoint save");
  Status s = save_checkpoint(comm, o.checkpoint_dir, step, id, params);
  if (s.ok() && comm.rank() == 0) {
    const std::string run = o.checkpoint_dir + "/run.json";
    if (!write_file_atomically(run, run_settings(o).dump(2) + "\n")) s = Status::io_error("cannot write " + run);
  }
  if (s.ok() && o.keep > 0 && comm.rank() == 0) s = remove_old_checkpoints(o.checkpoint_dir, o.keep);
  return first_failure(comm, s);
}

// A step whose loss or gradient norm is not finite (`what` names the first such tensor): skipped
// (no update; said on stderr and in the metrics line) while --skip-nonfinite allows, else the
// error that stops training, the same on every rank.
Status skip_nonfinite(const TrainOptions& o, Communicator& comm, MetricsFile& metrics, int64_t step,
                      const std::string& what, const GradNorm& norm, int64_t count, int64_t* skipped) {
  if (*skipped == o.skip_nonfinite)
    return Status::invalid_argument(
        "step " + std::to_string(step) + ": " + what + " is not finite (NaN or Inf); training stopped before the "
        "update, and " + (o.checkpoint_dir.empty() ? std::string("no checkpoint was asked for")
                                                   : "the last checkpoint in " + o.checkpoint_dir + " is kept") +
        ". Lower --lr, raise --warmup, use --clip, or pass --skip-nonfinite N to skip up to N such steps");
  ++*skipped;
  if (comm.rank() == 0)
    std::fprintf(stderr, "untied train: step %lld: %s is not finite; the update is skipped (%lld of %lld "
                         "allowed by --skip-nonfinite)\n",
                 (long long)step, what.c_str(), (long long)*skipped, (long long)o.skip_nonfinite);
  const Status ms = metrics.write(Json{{"step", step}, {"skipped", true},
                                       {"loss", as_printed("%.6f", count > 0 ? norm.loss_sum / count : 0.0)},
                                       {"grad_norm", as_printed("%.6g", norm.norm)}, {"nonfinite", what}});
  return o.metrics_path.empty() ? Status::ok_status() : first_failure(comm, ms);
}

// The stop asked for on any rank (TrainOptions::stop_request: the largest signal number), agreed
// at the end of a step (collective, where a request can come at all); 0: go on.
int agree_stop(Communicator& comm, const std::atomic<int>* request) {
  if (request == nullptr) return 0;
  int64_t stop = request->load();
  comm.all_reduce(&stop, &stop, 1, DType::kI64, ReduceOp::kMax);
  return static_cast<int>(stop);
}

// A finished step (1-based) into the run's summary.
void record_step(TrainSummary& sum, const StepFigures& f, const Allocator& alloc, int64_t step) {
  sum.peak = f.mem;
  sum.live_at_peak = alloc.live_at_peak();
  sum.host_peak = f.host_peak;
  sum.losses.push_back(f.loss);
  if (step == sum.first_step + 1) sum.first_loss = f.loss;
  sum.last_loss = f.loss;
  sum.last_accuracy = f.accuracy;
  sum.last_step = step;
}

// An output failed at step `step` (`why`): the state is saved first (to the checkpoint directory,
// or without one beside --save-hf, or in the working directory) and the error says where, so that
// no trained step is lost with the output.
Status stop_with_checkpoint(const TrainOptions& o, Communicator& comm, int64_t step, const std::string& id,
                            ShardedParams& params, const Status& why) {
  TrainOptions to = o;
  if (to.checkpoint_dir.empty())
    to.checkpoint_dir = (o.save_hf.empty() ? std::string("untied-checkpoint") : o.save_hf + "-checkpoint");
  const Status saved = save(to, comm, step, id, params);
  return Status::io_error(why.message() + (saved.ok() ? "; the state of step " + std::to_string(step) +
                                                            " is saved in " + to.checkpoint_dir +
                                                            " (resume with --checkpoint-dir " + to.checkpoint_dir +
                                                            " --resume)"
                                                      : "; saving a checkpoint failed too: " + saved.message()));
}

// Where the data stands after step `step` (1-based): each stream's passes in the metrics line
// ("epoch", the pass the step's last sample is in, with one stream), and a line on stderr when a
// stream's pass changes within the step (the data wrapped).
void note_data_passes(const DataSource& data, const TrainOptions& o, int64_t S, int64_t step, Json* line) {
  const std::vector<DataSource::Pass> now = data.passes(step * o.batch - 1, S);
  if (now.empty()) return;
  const std::vector<DataSource::Pass> before = data.passes((step - 1) * o.batch - 1 < 0 ? 0 : (step - 1) * o.batch - 1, S);
  Json passes = Json::object();
  for (size_t k = 0; k < now.size(); ++k) {
    passes[now[k].name] = as_printed("%.4f", now[k].passes);
    const auto pass = static_cast<int64_t>(std::floor(now[k].passes)), was = static_cast<int64_t>(std::floor(before[k].passes));
    if (pass > was)
      std::fprintf(stderr, "untied train: data: %s wrapped: pass %lld of it begins in step %lld\n", now[k].name.c_str(),
                   (long long)pass + 1, (long long)step);
  }
  if (now.size() == 1) (*line)["epoch"] = static_cast<int64_t>(std::floor(now[0].passes)) + 1;
  (*line)["data_passes"] = passes;
}

// Seconds since the epoch (the TensorBoard events' wall time).
double wall_clock_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// --eval-data: eval's loop over the run's current weights, with its strategy and ranks; the
// result on every rank, a line on rank 0's stderr.
StatusOr<EvalResult> evaluate_during_training(Device& dev, Communicator& comm, const TrainOptions& o,
                                              ShardedParams& params, Decoder& decoder, int64_t step) {
  const DataSource& data = *o.eval_data;
  const int64_t S = o.decoder.seq;
  EvalOptions eo{.model = o.model, .decoder = o.decoder, .samples = o.eval_samples, .buckets = 1,
                 .window = o.window, .doc_mask = o.doc_mask};
  if (eo.samples == 0) eo.samples = data.samples_per_pass(S);
  watchdog_note(1, "eval");
  auto r = evaluate_weights(dev, comm, data, eo, params, decoder);
  if (r.ok() && comm.rank() == 0)
    std::fprintf(stderr, "untied train: eval at step %lld: loss %.4f, perplexity %.4g, next-token accuracy %.1f%% (%lld "
                 "samples, %lld tokens)\n",
                 (long long)step, r.value().loss, r.value().perplexity, 100.0 * r.value().accuracy,
                 (long long)r.value().samples, (long long)r.value().tokens);
  return r;
}

// With --save-hf, the trained model as a Hugging Face directory (nothing in a rehearsal).
Status save_hf(const TrainOptions& o, Device& dev, Communicator& comm, ShardedParams& params) {
  if (o.save_hf.empty() || !dev.backed()) return Status::ok_status();
  dev.synchronize();
  return save_hf_model(o.save_hf, params, comm, o.model,
                       SaveHfOptions{.max_position = std::max<int64_t>(o.decoder.seq, 4096),
                                     .source_config = o.hf_model.empty() ? "" : o.hf_model + "/config.json",
                                     .dtype = o.save_hf_dtype.empty() ? hf_dtype_of_config(o.hf_model + "/config.json")
                                                                      : o.save_hf_dtype,
                                     .tokenizer_from = o.hf_model,
                                     .window = o.window});
}

// ---- fault injection (tests only: fault.h) ------------------------------------------------------

// A NaN in the fault's parameter's master shard (kNanWeight) or gradient shard (kNanGradient), at
// its step, where this rank owns elements of it.
void inject_nan(const Fault& f, FaultKind kind, int64_t step, Device& dev, const ShardedParams& params) {
  if (f.kind != kind || f.step != step || !dev.backed()) return;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int i = std::min(f.param, params.num_params() - 1);
  if (params.owned_elems(i) > 0)
    dev.copy(kind == FaultKind::kNanWeight ? params.master(i) : params.grad(i), &nan, sizeof nan);
}

}  // namespace

StatusOr<TrainSummary> train(Device& dev, Communicator& dev_comm, Communicator& comm, const DataSource& data,
                             const TrainOptions& asked) {
  UNTIED_CHECK(dev_comm.size() == comm.size() && dev_comm.rank() == comm.rank(),
               "train: the device communicator must have the ranks of the host one");
  if (Status s = validate(asked, comm.size()); !s.ok()) return s;
  auto resolved = resolve_run(asked, comm.size(), MachineMemory{});
  if (!resolved.ok()) return resolved.status();
  const TrainOptions& o = resolved.value().o;
  const RunGeometry& g = resolved.value().g;
  if (data.vocab_size() > o.model.vocab)
    return Status::invalid_argument("the data's vocabulary (" + std::to_string(data.vocab_size()) +
                                    ") is larger than the model's (" + std::to_string(o.model.vocab) + ")");

  if (o.eval_data != nullptr) {
    Status es;
    if (o.eval_data->vocab_size() > o.model.vocab)
      es = Status::invalid_argument("the --eval-data vocabulary (" + std::to_string(o.eval_data->vocab_size()) +
                                    ") is larger than the model's (" + std::to_string(o.model.vocab) +
                                    "): tokenize it with the model's own tokenizer");
    else if (o.eval_samples == 0 && o.eval_data->samples_per_pass(o.decoder.seq) == 0)
      es = Status::invalid_argument("the --eval-data holds " + std::to_string(o.eval_data->stream_tokens()) +
                                    " tokens, fewer than one sequence of --seq " + std::to_string(o.decoder.seq) +
                                    ": give more, or --eval-samples (samples then wrap around it)");
    if (Status all = first_failure(comm, es); !all.ok()) return all;
  }

  // The model: its sharded state, and the Decoder. Offloaded block inputs live in host memory
  // (page-locked on a GPU), counted apart from the device budget.
  Allocator& alloc = dev.allocator();
  ShardedParams params(dev, dev_comm, parameter_descriptors(o.model), o.decoder.dtype, ShardedState::kTraining,
                       experts_parallel(o.model, o.decoder, dev_comm.size()));
  if (Status s = load_initial_weights(o, dev, comm, params); !s.ok()) return s;
  Allocator host(o.rehearsal || !dev.backed() ? make_counting_memory() : dev.host_memory(),
                 Allocator::Options{.budget_bytes = o.host_budget_bytes / o.ranks_per_node, .name = "host"});
  Decoder decoder(dev, dev_comm, o.model, o.decoder, o.offload_inputs ? &host : nullptr);

  // Where the run starts and what it writes: one job per checkpoint directory (rank 0 holds the
  // lock until the run ends).
  StatusOr<CheckpointLock> lock = CheckpointLock();
  if (comm.rank() == 0 && !o.checkpoint_dir.empty() && !o.rehearsal) lock = CheckpointLock::acquire(o.checkpoint_dir);
  if (Status s = first_failure(comm, lock.ok() ? Status::ok_status() : lock.status()); !s.ok()) return s;
  const std::string id = identity(o, comm.size(), data);
  auto started = start_step(o, comm, id, params);
  if (!started.ok()) return started.status();
  const int64_t start = started.value();
  if (Status s = prepare_outputs(o, comm); !s.ok()) return s;
  auto opened = open_metrics(o, comm, start);
  if (!opened.ok()) return opened.status();
  MetricsFile metrics = std::move(opened).value();
  std::optional<TensorBoardWriter> board;  // rank 0's, with --tensorboard
  {
    Status bs;
    if (comm.rank() == 0 && !o.tensorboard_dir.empty() && !o.rehearsal) {
      auto b = TensorBoardWriter::open(o.tensorboard_dir, wall_clock_s());
      if (b.ok()) board.emplace(std::move(b).value());
      else bs = b.status();
    }
    if (Status all = first_failure(comm, bs); !all.ok()) return all;
  }

  const Fault fault = fault_from_environment(comm.rank());
  int64_t skipped = 0;  // non-finite steps skipped (skip_nonfinite)
  StepBatch batch(o, g, comm.rank());
  OpTimes op_times;  // each kernel op's time per step, for the metrics (CPU ranks); unset on return
  struct OpTimesGuard {
    Device& dev;
    ~OpTimesGuard() { dev.op_times = nullptr; }
  } op_times_guard{dev};
  dev.op_times = &op_times;

  TrainSummary sum;
  sum.first_step = start;
  const int64_t end = o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps;
  Progress progress(start, end, o.steps, comm.rank() == 0 && o.progress,
                    data.kind() == "kv" ? "answer acc" : "next-token acc");
  if (const int64_t cut = data.samples_cut(g.S); cut > 0 && comm.rank() == 0)
    std::fprintf(stderr,
                 "untied train: data: %lld supervised samples are longer than S = %lld and are cut at S (their tail "
                 "is not trained on): raise --seq to keep them whole\n",
                 (long long)cut, (long long)g.S);
  EvalResult eval_figures;  // this step's evaluation (--eval-every), for its metrics line
  const TokenFlops flops = flops_per_token(o.model, g.S, o.decoder.recompute);
  const double peak = o.peak_tflops > 0 ? o.peak_tflops : known_peak_tflops(dev.name(), g.dtype).value_or(0.0);
  for (int64_t s = start; s < end; ++s) {
    const int64_t step = s + 1;
    watchdog_note(0, "step " + std::to_string(step));
    watchdog_note(1, "data");
    fault_at_step_start(fault, step, comm);
    inject_nan(fault, FaultKind::kNanWeight, step, dev, params);
    op_times.seconds.clear();
    const double t0 = now_s();
    if (Status ds = first_failure(comm, batch.load(data, s, dev.backed())); !ds.ok()) return ds;
    const int64_t count = batch.labelled(comm, dev.backed());
    const double t1 = now_s();

    watchdog_note(1, "forward and backward");
    fault_before_forward(fault, step, dev_comm);
    BatchSums st = forward_backward(decoder, params, batch, count);
    const double t2 = now_s();
    inject_nan(fault, FaultKind::kNanGradient, step, dev, params);
    if (fault.kind == FaultKind::kNanLoss && fault.step == step) st.sums.loss_sum = std::numeric_limits<double>::quiet_NaN();

    watchdog_note(1, "optimizer");
    alloc.set_phase(Phase::kOptimizer);
    const GradNorm norm = grad_norm(dev, comm, params, st.sums.loss_sum);
    if (!norm.finite()) {
      const std::string what = first_nonfinite(comm, params, decoder, batch, norm, st.nonfinite_sample);
      params.zero_grads();
      alloc.set_phase(Phase::kSetup);
      if (Status stop = skip_nonfinite(o, comm, metrics, step, what, norm, count, &skipped); !stop.ok()) return stop;
      continue;
    }
    const float lr = learning_rate(o, s);
    adamw_update(dev, params, o, lr, step, norm.norm);
    params.zero_grads();
    alloc.set_phase(Phase::kSetup);
    const double t3 = now_s();

    const StepFigures f = agree_figures(comm, alloc, host, st.sums, count, t3 - t0);
    record_step(sum, f, alloc, step);
    const double tps = static_cast<double>(g.S * o.batch) / (f.step_s * comm.size());
    if (o.eval_data != nullptr && !o.rehearsal && ((o.eval_every > 0 && step % o.eval_every == 0) || step == end)) {
      auto e = evaluate_during_training(dev, comm, o, params, decoder, step);
      if (!e.ok()) return e.status();
      eval_figures = e.value();
    }
    Json line = metrics_line(StepMetrics{
        .step = step, .loss = f.loss, .accuracy = f.accuracy, .lr = lr, .grad_norm = norm.norm,
        .tokens_per_s_per_rank = tps, .step_s = f.step_s, .data_s = t1 - t0, .forward_backward_s = t2 - t1,
        .optimizer_s = t3 - t2, .mem = &f.mem, .ops = op_times.seconds.empty() ? nullptr : &op_times});
    if (comm.rank() == 0) note_data_passes(data, o, g.S, step, &line);
    {  // what users compare across systems (flops.h)
      const double tokens = static_cast<double>(g.S * o.batch);
      const double model = flops.model * tokens / f.step_s / comm.size() / 1e12;
      line["model_tflops_per_rank"] = as_printed("%.4g", model);
      line["hardware_tflops_per_rank"] = as_printed("%.4g", flops.hardware * tokens / f.step_s / comm.size() / 1e12);
      line["mfu"] = peak > 0 ? Json(as_printed("%.4f", model / peak)) : Json(nullptr);
      line["tokens_seen"] = step * o.batch * g.S;
      line["peak_bytes"] = f.mem.peak_total;
    }
    if (o.model.experts > 0) {  // the router's term of the loss and each MoE layer's tokens per expert
      line["router_aux_loss"] = as_printed("%.6g", f.router_aux);
      line["expert_load"] = expert_load_json(o.model, st.sums.expert_load);
      int64_t sent = st.sums.moe_sent_bytes;  // the most any rank sent
      comm.all_reduce(&sent, &sent, 1, DType::kI64, ReduceOp::kMax);
      line["moe_all_to_all_bytes_per_rank"] = sent;
    }
    if (eval_figures.samples > 0) {
      line["eval_loss"] = as_printed("%.6f", eval_figures.loss);
      line["eval_perplexity"] = as_printed("%.6g", eval_figures.perplexity);
      line["eval_accuracy"] = as_printed("%f", eval_figures.accuracy);
      line["eval_tokens"] = eval_figures.tokens;
      eval_figures = EvalResult{};
    }
    Status ms = metrics.write(line);
    if (ms.ok() && board) ms = board->add_scalars(step, wall_clock_s(), metrics_scalars(line));
    if ((!o.metrics_path.empty() || !o.tensorboard_dir.empty()) &&  // a checkpoint first, then stop
        !(ms = first_failure(comm, ms)).ok())
      return stop_with_checkpoint(o, comm, step, id, params, ms);
    if (comm.rank() == 0) progress.step_done(step, f.loss, f.accuracy, tps);

    const int stop = agree_stop(comm, o.stop_request);  // a signal on any rank: this step is the last
    if (!o.checkpoint_dir.empty() && (step == end || (o.save_every > 0 && step % o.save_every == 0) || stop != 0))
      if (Status cs = save(o, comm, step, id, params); !cs.ok()) return cs;
    if (stop != 0) {
      sum.stopped_by = stop;
      sum.saved_at_stop = !o.checkpoint_dir.empty();
      break;
    }
  }
  if (Status ms = first_failure(comm, metrics.close()); !ms.ok()) return ms;
  if (sum.stopped_by == 0)
    if (Status hs = save_hf(o, dev, comm, params); !hs.ok())  // the trained model is not lost with it
      return o.checkpoint_dir.empty() ? stop_with_checkpoint(o, comm, sum.last_step, id, params, hs)
                                      : Status::io_error(hs.message() + "; the checkpoint of step " +
                                                         std::to_string(sum.last_step) + " in " + o.checkpoint_dir +
                                                         " holds the trained model: untied export --checkpoint-dir " +
                                                         o.checkpoint_dir + " --out DIR writes it");
  return sum;
}

}  // namespace untied

// The training loop: data -> decoder forward/backward -> gradient clipping -> AdamW on the
// shards -> metrics, checkpoints. Collective over the communicator; every rank runs it.
//
// Per step s (0-based): samples s*batch .. s*batch + batch - 1 of the data source, this rank's
// L = S / C positions of each, run one after the other with their gradients added; the loss is
// the mean over all labelled tokens of the step (every rank, every sequence); the learning rate warms up linearly for
// `warmup` steps to `lr` and then follows a cosine that would reach `lr * min_lr_ratio` at step
// `steps` (one past the last);
// gradients are clipped to global norm `clip` (0 = off) before AdamW (beta1, beta2, eps,
// weight_decay on matrices only).
// Rank 0 prints a progress bar with ETA (stderr) and appends one JSON line per step to the
// metrics file (a resumed run first drops the lines after its checkpoint's step). With a checkpoint directory, the state is saved every `save_every` steps and at
// the end; `resume` continues from the newest checkpoint there, exactly (the step, the data and
// the arithmetic are deterministic).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "untied/comm/communicator.h"
#include "untied/model/decoder.h"
#include "untied/model/run_geometry.h"
#include "untied/train/data.h"

namespace untied {

struct TrainOptions {
  ModelConfig model;
  DecoderOptions decoder;
  int64_t steps = 100;
  int64_t batch = 1;  // sequences per step (micro-batches whose gradients add up)
  float lr = 3e-3f, min_lr_ratio = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, clip = 1.0f;
  int64_t warmup = 10;
  uint64_t seed = 0;
  int threads = 1;
  int64_t budget_bytes = 0;
  std::string checkpoint_dir;  // empty: no checkpoints
  int64_t save_every = 0;      // 0: only at the end (when checkpoint_dir is set)
  bool resume = false;
  // With resume: the step to resume from (0: the newest intact one). A checkpoint resumes at any
  // rank count, strategy, ring and U (load_checkpoint reshards it).
  int64_t resume_from = 0;
  std::string metrics_path;    // empty: no metrics file
  // The peak TFLOP/s of one rank's device for MFU; 0: the device's known peak (flops.h), or no MFU.
  double peak_tflops = 0;
  std::string tensorboard_dir; // non-empty: rank 0 writes every metrics line's numbers there as TensorBoard scalars
  // Evaluation while training: every eval_every steps (and after the last), eval_samples samples
  // (0: every whole sequence) of eval_data, with the run's strategy, ranks and current weights
  // (evaluator.h); its loss, perplexity and accuracy go into the metrics line and the log. None
  // when eval_data is null or eval_every is 0.
  const DataSource* eval_data = nullptr;
  int64_t eval_every = 0;
  int64_t eval_samples = 0;
  bool progress = true;
  int64_t stop_after = 0;      // > 0: stop (and save) after this step, as if interrupted
  bool rehearsal = false;      // count every allocation of the real schedule, back none, skip compute
  bool offload_inputs = false; // keep the blocks' saved inputs in host memory (outside the budget);
                               // which blocks': decoder.offload_keep_first and offload_every
  // Host memory per node for the offloaded block inputs (0 = unlimited), shared evenly by the
  // node's ranks_per_node ranks: validate() checks the need against it before any compute, and
  // the host allocator holds each rank to its share.
  int64_t host_budget_bytes = 0;
  int ranks_per_node = 1;
  // Sliding-window attention: a query sees at most `window` keys, itself included (0 = all). The
  // documents come from the data (DataSource::document_starts); any S runs, padded.
  int64_t window = 0;
  // false: the documents keep their RoPE positions and labels but attention crosses them (what a
  // packed-sequence bug does; for measuring what the mask is worth).
  bool doc_mask = true;
  // Non-empty: the initial weights come from this Hugging Face model directory (hf_weights.h),
  // whose config.json gave `model`; unless resuming, when the checkpoint's come instead.
  std::string hf_model;
  // Non-empty: at the end, the model is written here as a Hugging Face directory (config.json and
  // model.safetensors) that transformers loads; its tensors in save_hf_dtype ("F32", "BF16", "F16").
  std::string save_hf;
  // "" (the default): the dtype of the source model (--hf-model's config.json), F32 without one.
  std::string save_hf_dtype;
  // A step whose loss or gradient norm is not finite stops training before its update (the last
  // checkpoint is kept), naming the first non-finite tensor; up to skip_nonfinite such steps are
  // skipped instead (no update; the metrics line says so).
  int64_t skip_nonfinite = 0;
  // > 0: after each save, only the newest `keep` step directories stay.
  int64_t keep = 0;
  // Where a stop is asked for (the process's SIGTERM, SIGINT or SIGUSR1: stop_signal.h), read at
  // the end of every step: any rank's nonzero value ends the run there on every rank, with a
  // checkpoint when a checkpoint directory is set (TrainSummary::stopped_by). Null: never.
  const std::atomic<int>* stop_request = nullptr;
};

struct TrainSummary {
  int64_t first_step = 0, last_step = 0;   // steps run: [first_step, last_step)
  double first_loss = 0, last_loss = 0;
  double last_accuracy = -1;               // -1 when the data has no answers
  std::vector<double> losses;              // every step run, in order
  MemoryStats peak;                        // peaks over the run, max over ranks (per tag, total)
  int64_t host_peak = 0;                   // offloaded block inputs, max over ranks
  std::vector<LiveBuffers> live_at_peak;   // this rank's buffers when its total peaked (rehearsal)
  int stopped_by = 0;                      // the signal that ended the run early (stop_request), or 0
  bool saved_at_stop = false;              // a checkpoint of last_step was written as it stopped
};

// Checks the options for `ranks` ranks (model, decoder, optimizer settings, the host budget); the
// message says which flag to change. REQUIRES nothing: any options.
Status validate(const TrainOptions& o, int ranks);

// The run's shapes (run_geometry.h) for `ranks` ranks. REQUIRES: validate(o, ranks).ok().
RunGeometry run_geometry(const TrainOptions& o, int ranks);

// What an automatic choice may plan one rank to use where no budget says: the free memory of its
// device and its share of its host's, 0 where not known (no limit). On the CPU backend the
// device's buffers are host memory (`shared`): the step's device peak and its host memory add up
// against `host`.
struct MachineMemory {
  int64_t device = 0, host = 0;
  bool shared = false;
};

struct RecomputeChoice {
  Recompute recompute = Recompute::kFull;
  std::string why;  // what decided kAuto, for the banner and the plan ("" when not kAuto)
};

// o.decoder.recompute with Recompute::kAuto resolved for `ranks` ranks: kSelective where the step
// with it fits every limit there is, kFull where one is exceeded. The limits: its planned device
// peak (plan_memory) within --mem-budget (o.budget_bytes), its host memory (host_memory) within the
// rank's share of --host-budget, and both within `machine`. kFull also where there is no limit at
// all (memory first: a plan for an unnamed machine), where the memory plan does not cover the run
// (nothing is kept that the plan has not counted) and with upipe's
// KeepLastStage::kOn (a stage that only a full recompute projects). Another value comes back as it
// is. A function of its arguments: the same on every rank given the same `machine`.
RecomputeChoice choose_recompute(const TrainOptions& o, int ranks, const MachineMemory& machine);

// o with every `auto` resolved for `ranks` ranks on `machine`, the one place they are: the
// recompute (choose_recompute) and upipe's kept last stage (KeepLastStage::kAuto: kept where that
// does not raise the step's planned peak, plan_memory; not kept where the closed forms do not
// cover the run). With the run's shapes. The options are checked first as a full recompute, so a
// real error is reported as itself; the message says which flag to change. A function of its
// arguments: the same on every rank given the same `machine`. Resolved options resolve to
// themselves.
struct ResolvedRun {
  TrainOptions o;              // decoder.recompute and decoder.keep_last_stage resolved
  RunGeometry g;               // run_geometry(o, ranks)
  std::string recompute_why;   // what decided Recompute::kAuto ("" when it was not asked)
};
StatusOr<ResolvedRun> resolve_run(const TrainOptions& o, int ranks, const MachineMemory& machine);

// Runs training. Errors the user can fix (bad data file, mismatched checkpoint) come back as
// a Status that is the same on every rank; budget overruns and bugs throw untied::Error.
//
// On `dev` (a CPU or CUDA device of this rank, or a counting device for a rehearsal): its
// buffers move over dev_comm (the NCCL or device-bound communicator), host figures over comm;
// the two have the same ranks. o.threads and o.budget_bytes are the device's business here.
// upipe's KeepLastStage::kAuto is resolved as resolve_run resolves it; the recompute must be
// resolved already (validate refuses Recompute::kAuto: resolve_run first).
StatusOr<TrainSummary> train(Device& dev, Communicator& dev_comm, Communicator& comm, const DataSource& data,
                             const TrainOptions& o);
// On a CPU device made from o.threads, o.budget_bytes and o.rehearsal; comm moves everything.
StatusOr<TrainSummary> train(Communicator& comm, const DataSource& data, const TrainOptions& o);

// The learning rate at 0-based step s.
float learning_rate(const TrainOptions& o, int64_t s);

}  // namespace untied

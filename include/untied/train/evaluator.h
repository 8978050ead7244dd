// Evaluation: the mean next-token loss of a model over a data source, its perplexity, its
// accuracy and speed, and the loss by position: the long-context curve that says whether the
// model uses the context it is given (the loss at late positions falls when it does).
//
// Sample i of the data is the S tokens the trainer would see as sample i (data.h: a token file
// is read as consecutive sequences of S tokens). Every position with a label counts (the last of
// each sample has none, nor a position before a document start). The forward runs with the same
// strategies, ranks and dtype as training (Decoder::evaluate), keeping nothing for a backward.
// Weights come from a Hugging Face directory, an untied checkpoint (written at any rank count),
// or, with neither, the model's initialisation (a baseline).
// Collective over the communicator; every rank runs it and gets the same result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "untied/comm/communicator.h"
#include "untied/core/allocator.h"
#include "untied/dist/sharded_params.h"
#include "untied/model/decoder.h"
#include "untied/train/data_source.h"
#include "untied/train/kv_task.h"
#include "untied/train/needle.h"

namespace untied {

struct EvalOptions {
  ModelConfig model;
  DecoderOptions decoder;      // seq S, strategy, ring, dtype, ...
  int64_t samples = 0;         // 0: every whole sample of the data (stream tokens / S); > 0: that many
  int64_t buckets = 16;        // the loss by position: [0, S) split into this many equal ranges
  // The position a token is counted at: in its document (true: documents longer than S count
  // on from where they began, in one more bucket [S, inf) when any token reaches it), or in
  // the S-token window (false).
  bool by_doc_position = false;
  int64_t window = 0;          // sliding-window attention (0: none)
  bool doc_mask = true;        // attend within documents only
  std::string hf_model;        // weights from this Hugging Face directory, or
  std::string checkpoint_dir;  // from this untied checkpoint (its `latest` step, or checkpoint_step), or neither: init(seed)
  int64_t checkpoint_step = 0; // with checkpoint_dir: the step to read (0: the one `latest` names)
  uint64_t seed = 0;
  std::string logits_path;     // non-empty: the first sample's logits, (S, V) float32 .npy in sequence order
                               // (gathered on every rank: refused above 1 GiB)
};

struct EvalResult {
  int64_t samples = 0;
  int64_t tokens = 0;            // predicted (labelled) tokens
  double loss = 0;               // mean cross-entropy over them (nats)
  double perplexity = 0;         // exp(loss)
  double accuracy = 0;           // top-1 next-token accuracy
  double seconds = 0;            // the forwards (max over ranks), data reads excluded
  double tokens_per_s = 0;       // samples * S / seconds: tokens run (all ranks together)
  bool by_doc_position = false;       // buckets are positions in the document (else in the window)
  std::vector<int64_t> bucket_begin;  // bucket b holds positions [bucket_begin[b], bucket_begin[b + 1]);
                                      // by document position, a last bucket [S, 2^63 - 1) when used
  std::vector<int64_t> bucket_tokens; // labelled positions in each
  std::vector<double> bucket_loss;    // their mean loss (0 when empty)
  MemoryStats peak;              // max over ranks
  int64_t checkpoint_step = -1;  // the step of the checkpoint evaluated, or -1
};

// Checks the options for `ranks` ranks; the message says which flag to change.
Status validate(const EvalOptions& o, int ranks);

// Runs the evaluation on `dev` (the rank's CPU or CUDA device); its buffers move over dev_comm,
// host figures over comm (as train()). Errors the user can fix come back as the same Status on
// every rank.
StatusOr<EvalResult> evaluate(Device& dev, Communicator& dev_comm, Communicator& comm, const DataSource& data,
                              const EvalOptions& o);

// The evaluation itself, over weights already in `params` (a run's current weights, or those
// evaluate() loaded) with `decoder` (built for o.model and o.decoder on these ranks): samples
// 0 .. o.samples - 1 of data. REQUIRES: o.samples > 0, validate(o, comm.size()).ok(). Collective.
StatusOr<EvalResult> evaluate_weights(Device& dev, Communicator& comm, const DataSource& data, const EvalOptions& o,
                                      ShardedParams& params, Decoder& decoder);

// --needle (needle.h): the weights as evaluate() loads them, then every cell of the grid, each
// trial one forward at S = its length with o's strategy, ranks and dtype. Collective; the same
// cells on every rank.
StatusOr<std::vector<NeedleCell>> evaluate_needle(Device& dev, Communicator& dev_comm, Communicator& comm,
                                                  const NeedleTokenizer& tok, const DataSource* haystack,
                                                  const EvalOptions& o, const NeedleOptions& n);

// --needle --data kv: the built-in task's own needle: for each length, `n.trials` kv samples of
// that length, each answer counted at the depth of its pair (KvTask::answer_depths, nearest of
// n.depths); per cell the answer accuracy, its share (exact = accuracy: one token per answer) and
// the mean log-likelihood per trial. So a model trained on the kv task reports as real models do.
StatusOr<std::vector<NeedleCell>> evaluate_kv_needle(Device& dev, Communicator& dev_comm, Communicator& comm,
                                                     const KvTask& kv, const EvalOptions& o, const NeedleOptions& n);

// One curve of the loss-by-position plot: the mean loss of each bucket at the bucket's middle
// position.
struct LossCurve {
  std::string label;
  std::vector<double> position, loss;
  double axis_end = 0;  // the x axis runs to here (S); 0: to the last point
};
LossCurve loss_curve(const EvalResult& r, const std::string& label);

// The curves as one SVG line plot (position on a linear axis, loss on the other, a legend),
// self-contained: no script, no external font or style.
std::string position_loss_svg(const std::vector<LossCurve>& curves, const std::string& title,
                              const std::string& x_label = "position in the sequence (token)");

}  // namespace untied

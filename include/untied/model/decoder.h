// The decoder's training step on one rank: forward and backward of the whole model written out
// per block over named buffers, with each block recomputed before its backward (Recompute,
// decoder_options.h: full, or selective: all but the attention).
//
// Each rank holds L = Sp / P tokens (the attention block exchanges them; token_layout.h says which;
// S is padded to Sp when the ranks do not divide it, sequence_mask.h; run_geometry.h has the
// shapes). The step:
//   h_0 = embed[tokens]
//   for each block l:  save h_l (full: the only activation kept; selective: with the attention's
//                      output and LSE);  h_{l+1} = block_l(h_l)
//   loss = cross_entropy(final_norm(h_N) lm_head^T, labels)  (fused, chunked: lm_head_loss.h)
//   for each block l, last to first: recompute block_l from h_l keeping its intermediates (from
//     the kept attention output, selective), then its backward, giving dh_l and the block's
//     weight gradients
//   embedding backward
// where block(x) = x + attn(rmsnorm(x)) + mlp(rmsnorm(x + attn(...))), the MLP and its RMSNorm
// run over tiles of `mlp_tile` tokens (w_down(silu(w_gate b) * w_up b)), forward and backward,
// so neither its (L, F) intermediates nor a normed (L, E) copy ever exist at once.
// Weights come from a ParameterStore (parameters.h) one group at a time, gathered before use and
// freed after, as typed views (BlockWeights); each group's gradients go back to the store right
// after its backward (with ZeRO-3 sharding, dist/sharded_params.h, a reduce-scatter).
//
// Tags: saved block inputs kActivations; norms, residual and MLP tiles kOther; the attention
// block's own buffers as attention_block.h says.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "untied/attention/attention_block.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/model/decoder_options.h"
#include "untied/model/model_config.h"
#include "untied/model/moe.h"
#include "untied/model/parameters.h"
#include "untied/model/run_geometry.h"

namespace untied {

struct StepSums {
  double loss_sum = 0;   // over this rank's labelled tokens
  int64_t count = 0;     // labelled tokens on this rank
  int64_t answers = 0;   // positions flagged is_answer on this rank
  int64_t correct = 0;   // of those, predicted (argmax) right
  // Mixture of experts (moe.h): router_aux_coef times the load-balancing loss, and the tokens
  // routed to each expert of each MoE layer ((MoE layers) x X, in layer order); both over every
  // rank already (the same on each). The step's loss is the mean cross-entropy plus router_aux.
  double router_aux = 0;
  std::vector<double> expert_load;
  int64_t moe_sent_bytes = 0;  // this rank's bytes to other ranks in the experts' all-to-alls
};

struct EvalSums {
  double loss_sum = 0;  // over this rank's labelled tokens
  int64_t count = 0;    // labelled tokens on this rank
  int64_t correct = 0;  // labelled tokens whose label is the argmax prediction
};

class Decoder {
 public:
  // REQUIRES: validate(m, o, comm.size()).ok().
  // host: when set, each offloaded block's saved input (input_offloaded) is moved there after the
  // block's forward and fetched back for its recompute (with every block offloaded, the device
  // holds one block input at a time).
  Decoder(Device& dev, Communicator& comm, const ModelConfig& m, const DecoderOptions& o, Allocator* host = nullptr);

  // Forward and backward of one sequence; gradients are ADDED to `params` (reduce_grads).
  // tokens, labels, is_answer (nullable): this rank's L positions, in host memory (the ids and
  // labels are copied to the device). global_count: labelled tokens over all ranks (the loss is
  // their mean).
  // mask: the sequence's documents and window (sequence_mask.h) over padded_seq() tokens; without
  // it, one causal sequence (padded). The rows past o.seq are padding: their labels must be
  // kIgnoreIndex.
  // aux_weight: the weight of this sequence's load-balancing loss (a MoE model; 1 / the batch's
  // sequences, so that the step's is their mean).
  StepSums forward_backward(ParameterStore& params, const int32_t* tokens, const int32_t* labels,
                            const uint8_t* is_answer, int64_t global_count, const SequenceMask& mask,
                            double aux_weight = 1.0);
  StepSums forward_backward(ParameterStore& params, const int32_t* tokens, const int32_t* labels,
                            const uint8_t* is_answer, int64_t global_count);
  // Evaluation: the forward alone, keeping nothing for a backward (each block's input is freed
  // once the block has run), and the loss. tokens, labels: this rank's L positions (host).
  // row_losses (host, nullable): L values, -log p(label) per position, 0 where unlabelled.
  // logits (host, nullable): (L, V) fp32, row-major (this rank's positions; for comparisons with
  // other implementations: it allocates an (L, V) buffer). No parameter gradient is touched.
  EvalSums evaluate(ParameterStore& params, const int32_t* tokens, const int32_t* labels, const SequenceMask& mask,
                    double* row_losses = nullptr, float* logits = nullptr);
  // Collective, for a step whose loss is not finite: runs the forward again, checking each
  // stage's output on every rank, and names the first that is not finite ("the output of block
  // 3 (its attention or its MLP)", "the embedding output", "the final norm's output"); "" when
  // all are finite (then the loss itself overflowed).
  std::string first_nonfinite_activation(ParameterStore& params, const int32_t* tokens, const SequenceMask& mask);
  // The length the decoder runs: o.seq padded to what the ranks divide (padded_config); rows
  // per rank L = padded_seq() / ranks.
  int64_t padded_seq() const { return g_.Sp; }
  // The run's shapes (run_geometry.h): L rows per rank, tiles, the head schedule, ...
  const RunGeometry& geometry() const { return g_; }

 private:
  struct BlockActs;
  struct MlpTile;
  // Where a block's input x (L, E) is during its backward: on the device, or (an offloaded input
  // whose fetched copy was dropped, DecoderOptions::refetch_inputs) only in host memory.
  struct BlockInput {
    Tensor x;
    bool on_host = false;  // x is the host copy (the device has none)
  };
  // attn_norm(x) a tile of rows at a time (o_.attn_tile), writing rstd (L) as it goes; x read from
  // the device or, x_on_host, copied from host memory a tile at a time.
  TiledInput normed_tiles(const BlockWeights& w, const Tensor& x, bool x_on_host, float* rstd);
  RmsNormShape norm_shape(int64_t rows) const;  // the block norms over (rows, E)
  bool offloads(int64_t layer) const { return host_ != nullptr && input_offloaded(o_, layer); }
  // Checks that mask covers padded_seq() tokens and makes it the mask of the step in progress.
  void use_mask(const SequenceMask& mask);
  // The forward with nothing kept for a backward: returns the final norm's input (L, E), each
  // block's input freed once the block has run. after_stage(stage, out) (0: the embedding's
  // output, 1 + l: block l's), when given, ends it early by returning false (out is returned).
  TensorBuffer forward_only(ParameterStore& params, const int32_t* tokens,
                            const std::function<bool(int64_t, const Tensor&)>& after_stage = {});
  // final_norm(h) (L, E), for the forward-only paths (no rstd kept).
  TensorBuffer final_norm_forward(const Tensor& h, const Tensor& weight);
  // mlp_norm(hm_tile) and its rstd (b, rstd of an MlpTile); mlp_tile_inputs adds the dense MLP's
  // gate and up projections.
  MlpTile mlp_norm_tile(const BlockWeights& w, const Tensor& hm_tile);
  MlpTile mlp_tile_inputs(const BlockWeights& w, const Tensor& hm_tile);
  // block(x) (L, E): without acts, returned (a new buffer named out_name, the next block's
  // input); with acts (the recompute), what backward needs is kept there and nothing returned.
  // x_on_host: x is the block input's host copy, read a tile at a time (needs g_.attn_tile).
  // kept_attn (the forward pass, Recompute::kSelective): the attention's output, LSE and mask
  // are moved there for the recompute (AttentionSaved::keep_output_only).
  // layer: the block's number (which MoE routing it records or follows).
  TensorBuffer block_forward(int layer, const BlockWeights& w, const Tensor& x, bool x_on_host, BlockActs* acts,
                             const std::string& out_name = "", AttentionSaved* kept_attn = nullptr);
  // dh (L, E): in, the gradient of the block's output; out, that of its input, in the same
  // buffer (the MLP backward turns it into d residual after attention in place, and dx is formed
  // into it a tile at a time). Block weight gradients (fp32, full local) into g (+=).
  // x: the block's input; one only in host memory is read from there by the attention's tiles
  // (g_.attn_tile) and fetched to the device again for the attn_norm backward at the end.
  void block_backward(int layer, const BlockWeights& w, const BlockWeights& g, const BlockInput& x, TensorBuffer& dh,
                      BlockActs& acts);
  // out_add (L, E) += mlp(mlp_norm(hm)), norm and MLP tile by tile.
  // A MoE layer's tiles (w.moe()) run MoeMlp: in the training forward pass (recording_) their
  // routing is kept in routes_ and their statistics in stats_, for the backward.
  void mlp_forward(int layer, const BlockWeights& w, const Tensor& hm, const Tensor& out_add);
  // dy (L, E) += mlp_norm'(mlp'(dy)) in place (dy becomes dhm, d residual after attention), tile
  // by tile, each tile's rows read before they are written; MLP and mlp_norm gradients into g (+=).
  void mlp_backward(int layer, const BlockWeights& w, const BlockWeights& g, const Tensor& hm, const Tensor& dy);
  // After the forward pass: the MoE statistics summed over the ranks, the load-balancing loss into
  // sums and its gradient into aux_grad_.
  void finish_moe_forward(StepSums& sums, double aux_weight);

  Device& dev_;
  Communicator& comm_;
  ModelConfig m_;
  DecoderOptions o_;
  RunGeometry g_;  // L = g_.L rows; tiles g_.mlp_tile, g_.attn_tile (0: off)
  std::unique_ptr<AttentionBlock> attn_;
  Allocator* host_;
  const SequenceMask* mask_ = nullptr;  // the mask of the step in progress
  // Mixture of experts: the MLP of the MoE layers, which of this rank's rows are real (not
  // padding: the statistics skip them), and per layer the training forward's routing (L k ids,
  // host) and statistics; aux_grad_ (X) the load-balancing loss's gradient (moe.h).
  std::unique_ptr<MoeMlp> moe_;
  std::vector<uint8_t> real_;
  bool recording_ = false;
  std::vector<std::vector<int32_t>> routes_;
  std::vector<MoeLayerStats> stats_;
  std::vector<float> aux_grad_;
};

}  // namespace untied

// The decoder's training step on one rank: forward and backward of the whole model written out
// per block over named buffers, with full recompute per block.
//
// Each rank holds L = S / C tokens (the attention block exchanges them; token_layout.h says which; S
// is padded when the ranks do not divide it, sequence_mask.h). The step:
//   h_0 = embed[tokens]
//   for each block l:  save h_l (the only activation kept);  h_{l+1} = block_l(h_l)
//   loss = cross_entropy(final_norm(h_N) lm_head^T, labels)  (fused, chunked: lm_head_loss.h)
//   for each block l, last to first: recompute block_l from h_l keeping its intermediates,
//     then its backward, giving dh_l and the block's weight gradients
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

#include "untied/attention/attention_block.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/model/model_config.h"
#include "untied/model/parameters.h"

namespace untied {

// upipe: whether a block's recompute keeps its attention's last stage (its q and its round's k
// and v) for the backward, which starts with that stage instead of projecting and exchanging them
// again (AttentionSaved::keep_last_stage). They are the buffers the recompute ends with, but they
// stay through the MLP's backward. kAuto: kept when that does not raise the step's planned peak
// (plan_memory, memory_plan.h), resolved by the trainer; a Decoder takes kAuto as kOn.
enum class KeepLastStage { kAuto, kOn, kOff };

// What a block's recompute before its backward runs again.
//   kFull       the whole block from its saved input (the least memory: one (L, E) per block).
//   kSelective  the block but its attention: the forward pass keeps each block's attention output
//               (L, H*D) and LSE (H/C_u heads' (S) rows per rank, fp32) beside its input, and the
//               recompute projects y from them instead of running the attention again
//               (AttentionSaved::output_kept): the attention kernel and the output exchange run
//               once per step instead of twice, and UPipe's recompute projects no q, k or v (its
//               backward does, stage by stage, as Ulysses' recompute does all at once), so the
//               two do the same work. The kept outputs are in the host allocator's memory when
//               the Decoder has one (offloaded inputs), else on the device. The same bits as kFull.
//   kAuto       kSelective where the step's planned memory with it fits, kFull otherwise: chosen
//               before a Decoder is built (choose_recompute, trainer.h), which refuses kAuto.
enum class Recompute { kFull, kSelective, kAuto };

struct DecoderOptions {
  int64_t seq = 0;  // S, global
  Strategy strategy = Strategy::kUPipe;
  int64_t upipe_heads = 0;  // 0 = C
  int64_t ring = 1;         // R (attention_block.h): ulysses/upipe across R ring groups
  bool overlap = false;     // upipe: the next stage's exchanges beside this one's compute (AttentionConfig)
  KeepLastStage keep_last_stage = KeepLastStage::kAuto;  // upipe with Recompute::kFull only
  Recompute recompute = Recompute::kFull;
  DType dtype = DType::kF32;  // activations and gathered weights
  int64_t mlp_tile = 0;       // tokens per MLP tile; 0 = min(L, max(E, 256))
  int64_t loss_chunk = 0;     // tokens per LM-head loss chunk; 0 = the kernel's default
  // With offloaded block inputs (the Decoder's host allocator): in each block's backward the
  // fetched input is dropped after the recompute and fetched again for the attn_norm backward at
  // the end, so it is not on the device during the attention's backward (one more copy of (L, E)
  // from the host per block). Results are the same bits either way.
  bool refetch_inputs = true;
  bool early_delta = true;  // AttentionConfig::early_delta
  // 2-D chunking of the attention's input: attn_norm(x) is computed a tile of this many rows at a
  // time as the attention's projections read it (TiledInput, attention_block.h), never whole; in
  // the backward of an offloaded input it is read from the host copy a tile at a time. 0: the MLP
  // tile; -1: off (attn_norm(x) made whole and held through the block's attention).
  int64_t attn_tile = 0;
  // 2-D chunking of the attention's input gradient: the attention hands dx out a tile of MLP-tile
  // rows at a time (TiledGrad, attention_block.h) and the attn_norm backward and the residual add
  // run on each tile as it comes, so no (L, E) fp32 dx exists (ulysses, upipe, ring: they keep
  // their returned q/k/v gradients instead, (L, H + 2 G_eff, D) in the block's dtype). false:
  // the attention writes the whole fp32 dx first. The same bits either way.
  bool tiled_dx = true;
  // With tiled_dx and a host allocator (offloaded inputs): the attention's returned q/k/v
  // gradients wait for dx in host memory (TiledGrad::host), not on the device through the
  // block's remaining stages (UPipe: the dq of every stage run before, at the last one's attention).
  // One (L, H + 2 G_eff, D) stash in host memory per rank, reused by every block; one more copy of
  // it each way per block. The same bits either way.
  bool grads_on_host = true;
  // With a host allocator (offloaded inputs), the attention's tiles and tiled_dx: d residual after
  // attention (the block's output gradient once the MLP's is added) waits in host memory through
  // the attention's backward, which reads it a tile at a time, and dx is made in a new device
  // buffer as its tiles come: no (L, E) buffer on the device through the attention's stages. One
  // (L, E) buffer in host memory per rank, one more copy of it each way per block. The same bits.
  bool dh_on_host = true;
  // With a host allocator, the attention's tiles and early_delta: the attention output saved for
  // the backward waits in host memory (TiledOutput::host), each stage's heads copied there as they
  // return, read back a tile at a time (the output projection, dwo, D): no (L, H*D) buffer on the
  // device through the stages, the MLP and the MLP's backward. One (L, H*D) buffer in host memory
  // per rank. The same bits.
  bool attn_out_on_host = true;
  // Which blocks' saved inputs go to the host allocator, when the Decoder has one (partial
  // offload): block l's when l >= offload_keep_first and (l - offload_keep_first) is a multiple of
  // offload_every. The defaults offload every block; the others stay on the device.
  int64_t offload_keep_first = 0;
  int64_t offload_every = 1;
};

// Validates model + options for `ranks` ranks (including the attention block's rules).
Status validate(const ModelConfig& m, const DecoderOptions& o, int ranks);
// The tiles the Decoder runs with on `rows` tokens per rank: MLP tile rows (DecoderOptions::
// mlp_tile, 0 = min(rows, max(E, 256))), and the attention input's tile rows (attn_tile; 0 when
// the input is made whole).
struct DecoderTiles {
  int64_t mlp = 0, attn = 0;
};
DecoderTiles decoder_tiles(const ModelConfig& m, const DecoderOptions& o, int64_t rows);
// Which of a block's buffers wait in host memory, on `rows` tokens per rank, where a host
// allocator exists (`host`: offloaded inputs): DecoderOptions::grads_on_host (with tiled_dx),
// dh_on_host (with tiled_dx and the attention's tiles) and attn_out_on_host (with early_delta
// and the attention's tiles), each where it applies. The one rule for the Decoder, the host
// memory it needs (trainer.h host_bytes) and the plan.
struct HostParts {
  bool grads = false, dh = false, attn_out = false;
};
HostParts host_parts(const ModelConfig& m, const DecoderOptions& o, int64_t rows, bool host);
// Whether block `layer`'s saved input is offloaded (with a host allocator), and how many of the
// model's blocks' are.
bool input_offloaded(const DecoderOptions& o, int64_t layer);
int64_t offloaded_inputs(const ModelConfig& m, const DecoderOptions& o);
// The attention block every layer of the decoder runs (its token_layout says which positions each
// rank holds).
AttentionConfig attention_config(const ModelConfig& m, const DecoderOptions& o);

struct StepSums {
  double loss_sum = 0;   // over this rank's labelled tokens
  int64_t count = 0;     // labelled tokens on this rank
  int64_t answers = 0;   // positions flagged is_answer on this rank
  int64_t correct = 0;   // of those, predicted (argmax) right
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
  StepSums forward_backward(ParameterStore& params, const int32_t* tokens, const int32_t* labels,
                            const uint8_t* is_answer, int64_t global_count, const SequenceMask& mask);
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
  int64_t padded_seq() const { return rows_ * comm_.size(); }

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
  MlpTile mlp_tile_inputs(const BlockWeights& w, const Tensor& hm_tile);
  // block(x) (L, E): without acts, returned (a new buffer named out_name, the next block's
  // input); with acts (the recompute), what backward needs is kept there and nothing returned.
  // x_on_host: x is the block input's host copy, read a tile at a time (needs attn_tile_).
  // kept_attn (the forward pass, Recompute::kSelective): the attention's output, LSE and mask
  // are moved there for the recompute (AttentionSaved::keep_output_only).
  TensorBuffer block_forward(const BlockWeights& w, const Tensor& x, bool x_on_host, BlockActs* acts,
                             const std::string& out_name = "", AttentionSaved* kept_attn = nullptr);
  // dh (L, E): in, the gradient of the block's output; out, that of its input, in the same
  // buffer (the MLP backward turns it into d residual after attention in place, and dx is formed
  // into it a tile at a time). Block weight gradients (fp32, full local) into g (+=).
  // x: the block's input; one only in host memory is read from there by the attention's tiles
  // (attn_tile_) and fetched to the device again for the attn_norm backward at the end.
  void block_backward(const BlockWeights& w, const BlockWeights& g, const BlockInput& x, TensorBuffer& dh,
                      BlockActs& acts);
  // out_add (L, E) += mlp(mlp_norm(hm)), norm and MLP tile by tile.
  void mlp_forward(const BlockWeights& w, const Tensor& hm, const Tensor& out_add);
  // dy (L, E) += mlp_norm'(mlp'(dy)) in place (dy becomes dhm, d residual after attention), tile
  // by tile, each tile's rows read before they are written; MLP and mlp_norm gradients into g (+=).
  void mlp_backward(const BlockWeights& w, const BlockWeights& g, const Tensor& hm, const Tensor& dy);

  Device& dev_;
  Communicator& comm_;
  ModelConfig m_;
  DecoderOptions o_;
  int64_t rows_;  // L
  int64_t tile_;
  int64_t attn_tile_;  // 0: off
  std::unique_ptr<AttentionBlock> attn_;
  Allocator* host_;
  const SequenceMask* mask_ = nullptr;  // the mask of the step in progress
};

}  // namespace untied

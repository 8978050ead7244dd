// The decoder's options (what each block's recompute keeps, its tiles, what waits in host memory)
// and the pure functions over them that the Decoder, the plans and the trainer share.
#pragma once

#include <cstdint>

#include "untied/attention/attention_block.h"
#include "untied/core/status.h"
#include "untied/model/model_config.h"

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
  // A mixture of experts (moe.h) over more than one rank: each rank owns X / ranks experts of
  // every MoE layer (their weights, gradients and AdamW state stay there, ShardedParams
  // experts_local), and each rank's tokens go to their experts' owners and back (all_to_allv)
  // when X is a multiple of the ranks. false, or X not a multiple: every rank runs every expert on
  // its own tokens, the experts gathered like the dense weights (replicated).
  bool expert_parallel = true;
  // Expert parallelism, for what is sized before the router has chosen (a rehearsal, the memory
  // plan): each rank's experts receive this many times the balanced share of rows (>= 1). A
  // real step sizes its receive buffers from the router's counts.
  double moe_skew = 1.0;
};

// The rows a rank's experts receive per MLP tile of `tile` rows before the router has chosen (a
// rehearsal, the plan): every expert's balanced share of the tile's tile * k rows, times
// o.moe_skew (rounded up) under expert parallelism; tile * k without it.
int64_t moe_planned_rows(const ModelConfig& m, const DecoderOptions& o, int ranks, int64_t tile);
// One expert's planned rows from another rank: its balanced share `rows` times skew, rounded up.
int64_t moe_skewed(int64_t rows, double skew);
// Expert e's balanced share of `rows` rows over `experts` (the first rows % experts get one more).
int64_t moe_balanced_share(int64_t rows, int64_t experts, int64_t e);
// The rows a rank's experts receive of every rank's `rows` planned rows (each expert's balanced
// share, times skew, rounded up: moe_skewed), summed over the experts.
int64_t moe_skewed_total(int64_t rows, int64_t experts, double skew);

// Whether a run of m with o on `ranks` ranks spreads its experts (DecoderOptions::expert_parallel).
bool experts_parallel(const ModelConfig& m, const DecoderOptions& o, int ranks);

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

}  // namespace untied

// The context-parallel attention block: what a model layer calls for its attention.
//
// Every rank of the communicator (C ranks) holds L = S / C consecutive tokens: rank r holds
// global positions r*L .. r*L + L - 1. Per rank:
//   x  (L, E)       input (already normed)              dx (L, E)   its gradient
//   wq (H*D, E)     wk, wv (G*D, E)    wo (E, H*D)      the Hugging Face Llama layout
//   y  (L, E)       output (before the residual add)    dy (L, E)   its gradient
// Forward: q = x wq^T, k = x wk^T, v = x wv^T; RoPE on q and k at each token's global position
// (its position in its document with packed documents); causal attention with standard GQA
// (query head h uses KV head h / (H/G)), restricted to each token's document and window when
// the sequence mask has them (sequence_mask.h); y = attn wo^T.
//
// Strategies (Strategy):
//   kLocal    one rank, no exchange: the reference.
//   kUlysses  all heads at once: project, all-to-all sequence->heads, attention on H/C heads
//             over the whole sequence, all-to-all back, output projection. Saves the attention
//             output (sequence layout), the LSE and the head-sharded q, k and v for backward.
//   kUPipe    H/U stages of U heads (U a multiple of C dividing H, see head_schedule.h for the
//             GQA condition; U = C by default). Each stage
//             projects only its heads, exchanges them, runs attention and writes its output
//             back into a preallocated (L, H, D) buffer. Stage buffers are reused; K/V heads are
//             exchanged once and stay resident while their query heads are processed (the GQA
//             schedule, head_schedule.h). Saves that output and the per-stage LSE (and, when
//             AttentionSaved::keep_last_stage asks, the last stage's q, k and v); backward
//             recomputes the other stages' projections.
//   kRing     zig-zag ring attention over all ranks (C = 1): K/V blocks passed around the ring,
//             partial results merged with an fp32 log-sum-exp rule (ring_attention.h).
//   ring > 1  (kUlysses, kUPipe) the hybrid: the all-to-all inside R groups of C = ranks / R
//             consecutive ranks, ring attention across the groups, per stage.
//   When G < C, each KV head is replicated for the exchange (requires C % G == 0) and the
//   gradients of its replicas are summed.
//
// Gradients: dx is this rank's (complete) gradient. dwq, dwk, dwv, dwo are LOCAL PARTIAL SUMS
// over this rank's tokens, overwritten (=): the full gradient is their sum over ranks (an
// all_reduce, or a reduce_scatter when the trainer shards it).
//
// Memory: every buffer comes from the device allocator. Tags: the attention output and the LSE
// kept for backward kActivations; projections (send buffers), per-stage buffers and kernel
// scratch kAttnWorkspace; all-to-all receive buffers kCommunication (ulysses keeps its q/k/v
// stage buffers, under those tags, until backward). The fp32 dx accumulator of bf16 runs is kOther.
//
// Storage: f32 or bf16 for x, weights, y and all gradients (the same dtype); compute in fp32.
// Thread safety: one block per rank; forward/backward are collective over the communicator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "untied/comm/communicator.h"
#include "untied/attention/sequence_mask.h"
#include "untied/attention/token_layout.h"
#include "untied/core/status.h"
#include "untied/core/tensor.h"
#include "untied/device/device.h"
#include "untied/kernels/rope.h"

namespace untied {

enum class Strategy { kLocal, kUlysses, kUPipe, kRing };
std::string_view strategy_name(Strategy s);
StatusOr<Strategy> parse_strategy(std::string_view s);  // "local" | "ulysses" | "upipe" | "ring"

struct AttentionConfig {
  int64_t seq = 0;        // S, global
  int64_t hidden = 0;     // E
  int64_t heads = 0;      // H
  int64_t kv_heads = 0;   // G
  int64_t head_dim = 0;   // D
  double rope_theta = 500000.0;
  RopeScaling rope_scaling = {};  // frequency scaling for long contexts (rope.h)
  DType dtype = DType::kF32;
  Strategy strategy = Strategy::kUPipe;
  int64_t upipe_heads = 0;  // U; 0 = C (most memory saved). Ignored unless kUPipe.
  // R, the ring degree of ulysses and upipe: R groups of C = ranks / R consecutive ranks, the
  // all-to-all inside a group, zig-zag ring attention across the groups (token_layout.h). kRing
  // is ulysses with R = ranks.
  int64_t ring = 1;
  // For measurements only: the contiguous ring layout (the imbalance zig-zag removes), and ring
  // exchanges waited for at once instead of overlapped with compute (the unhidden cost).
  RingOrder ring_order = RingOrder::kZigzag;
  bool ring_overlap = true;
  // UPipe (more than one stage): stage s+1's projections and all-to-alls run while stage s is
  // attended to, forward and backward, and stage s's result goes back meanwhile. Costs one more
  // stage of exchange buffers (counted by the allocator, so rehearsal sees it); the arithmetic,
  // and so every result bit, is the same either way.
  bool overlap = false;
  // Ulysses and UPipe: the backward computes D = rowsum(dO * O) of every head first (one more
  // pass of the dO projection, head by head) and frees the saved attention output (L, H*D) before
  // its first stage, instead of holding it through every stage; false keeps it (and computes D per
  // stage). The arithmetic of D, and so every result bit, is the same either way.
  bool early_delta = true;
  // Qwen3: RMSNorm over each head's D values of q and of k (weights q_norm, k_norm (D)),
  // after the projection and before RoPE.
  bool qk_norm = false;
  float norm_eps = 1e-6f;
  // Qwen2: biases on the q, k and v projections (bq (H*D), bk, bv (G*D)), added to each head's
  // projection before the norm and RoPE; in UPipe a head's bias travels with its head's stage.
  bool qkv_bias = false;
};

// The longest sequence and the widest block untied takes (validate refuses more): with them every
// buffer's size, and every plan's sum of sizes, fits a 64-bit byte count with room to spare
// (2^36 tokens x 2^17 columns x 4 bytes = 2^55).
constexpr int64_t kMaxSeq = int64_t{1} << 36;
constexpr int64_t kMaxWidth = int64_t{1} << 17;  // E, and H x D

// Ulysses and UPipe project a stage's heads for every rank of the group in one GEMM over at most
// this many rows at a time (its output, (rows, U*D), is scratch: the memory plan counts it).
constexpr int64_t kProjectionRows = 1024;

// Checks that `cfg` can run on `ranks` ranks. The message says what to change. Pure: every rank
// computes the same answer, so every rank refuses together before any compute.
Status validate(const AttentionConfig& cfg, int ranks);

struct AttentionWeights {
  Tensor wq, wk, wv, wo;  // (H*D, E), (G*D, E), (G*D, E), (E, H*D)
  Tensor q_norm = {}, k_norm = {};  // (D) each, with qk_norm only
  Tensor bq = {}, bk = {}, bv = {};  // (H*D), (G*D), (G*D), with qkv_bias only
};

struct AttentionGrads {
  Tensor dwq, dwk, dwv, dwo;  // shapes as the weights; overwritten with local partial sums
  Tensor dq_norm = {}, dk_norm = {};  // (D), with qk_norm only; overwritten with local partial sums
  Tensor dbq = {}, dbk = {}, dbv = {};  // with qkv_bias only; overwritten with local partial sums
};

// The ring degree R and the Ulysses degree C = ranks / R that `cfg` runs with on `ranks` ranks.
int ring_degree(const AttentionConfig& cfg, int ranks);
int ulysses_degree(const AttentionConfig& cfg, int ranks);
// Heads per stage that `cfg`'s strategy runs on `ranks` ranks: H for local, ulysses and ring (one
// stage), upipe_heads for upipe (0 = C). The one place U is resolved.
int64_t stage_heads_of(const AttentionConfig& cfg, int ranks);
// Which positions each rank holds under cfg on `ranks` ranks (token_layout.h).
TokenLayout token_layout(const AttentionConfig& cfg, int ranks);
// cfg with its sequence padded to the length `ranks` ranks run (padded_seq, sequence_mask.h):
// what a caller with any S builds the block for, masking the padding (SequenceMask::padded_to)
// and counting no loss on it. Unchanged when the ring degree does not divide the ranks (validate
// then says so).
AttentionConfig padded_config(const AttentionConfig& cfg, int ranks);

// What forward keeps for backward; owned by the caller between the two calls. Typed records, one
// per stage and one per round of stages (head_schedule.h), so that forward and backward name
// each tensor they hand over. Tags: kActivations for attn_out and lse; the head-sharded tensors
// keep the tags they were made with (kCommunication for all-to-all receives, kAttnWorkspace).
struct SavedQkNorm {  // Qwen3 (qk_norm): the pre-norm projection and its rstd, for the norm's backward
  TensorBuffer pre, rstd;
};
struct SavedStage {
  TensorBuffer lse;       // (u, S) fp32: every strategy
  // Unless the strategy recomputes (upipe; it keeps only its last stage's, see `kept`): q after
  // norm and RoPE (S, u, D), head-sharded; local keeps q (S, H, D). o: the kernel's head-sharded
  // output (S, u, D) while the stage runs (freed once it is back in attn_out: no backward reads it).
  TensorBuffer q, o;
  SavedQkNorm q_norm;     // qk_norm only, unless recomputed
  bool kept = false;      // upipe: q (and q_norm) kept by forward, not recomputed by backward
};
struct SavedRound {       // the KV heads resident for one round, unless recomputed
  TensorBuffer k, v;      // (S, w, D) head-sharded (local: (S, G, D)), k after norm and RoPE
  SavedQkNorm k_norm;     // qk_norm only
  bool kept = false;      // upipe: k, v (and k_norm) kept by forward, not recomputed by backward
};
struct SavedMask {         // the mask forward ran with, as the kernels read it (kOther, int64)
  SequenceMask mask;
  TensorBuffer doc_starts;  // (num_docs) on the device, with more than one document
  TensorBuffer rope_rows;   // RoPE positions of this rank's L rows, with more than one document
  TensorBuffer rope_group;  // and of its group sequence's S / R rows (head-sharded tensors)
};
struct AttentionSaved {
  TensorBuffer attn_out;            // (L, H, D) kActivations: attention output, standard head order
  // > 0: attn_out is in host memory (TiledOutput::host), read back this many rows at a time.
  int64_t attn_out_host_tile = 0;
  std::vector<SavedStage> stages;   // one per stage, in stage order
  std::vector<SavedRound> rounds;   // one per round, in round order (upipe: only the last kept)
  SavedMask mask;
  // Set by the caller before forward; reset() leaves it. upipe: whether forward keeps its last
  // stage's q and that stage's round's k and v for the backward, which runs the stages last first
  // and so recomputes only the others'. They are the buffers forward ends with, but they stay
  // beside that stage's output exchange and whatever the caller runs before the backward, so the
  // default is the lean one: recomputed.
  bool keep_last_stage = false;
  // Selective recompute (decoder.h Recompute::kSelective): set by keep_output_only() on what a
  // forward saved, kept by the caller until the block is run again on the same x, weights and
  // mask (the recompute before its backward). That forward then runs no attention kernel and
  // exchanges no output: it projects y from the saved output (the same bits) and makes only what
  // the backward reads besides it: ulysses, ring and local project and keep q, k and v again;
  // upipe projects nothing (its backward projects every stage's, as it does after a full
  // forward). reset() clears it.
  bool output_kept = false;
  void reset() {
    attn_out.reset();
    attn_out_host_tile = 0;
    stages.clear();
    rounds.clear();
    mask = SavedMask{};
    output_kept = false;
  }
  // What a forward saved reduced to its attention output, each stage's LSE and the mask (q, k, v,
  // their norms' inputs and the head-sharded outputs freed), with output_kept set: what the
  // selective recompute keeps per block from the forward pass to the backward.
  void keep_output_only() {
    for (SavedStage& st : stages) {
      TensorBuffer lse = std::move(st.lse);
      st = SavedStage{};
      st.lse = std::move(lse);
    }
    for (SavedRound& rd : rounds) rd = SavedRound{};
    output_kept = true;
  }
};

// What the ring's exchanges cost a rank (ring and hybrid strategies; zero otherwise): the time
// spent waiting for them is the communication that compute did not hide.
struct RingStats {
  int64_t exchanges = 0;
  int64_t bytes_sent = 0;
  double wait_s = 0;     // waiting for exchanges (with overlap: the part compute did not hide)
  double compute_s = 0;  // the ring steps' attention (host clock: on a GPU, issue time only)
};

// The block's input x (L, E) given a tile of rows at a time instead of whole (2-D chunking: the
// sequence as well as the heads): rows(r0, n, dst) writes rows [r0, r0 + n) of x, n <= tile, into
// dst (n, E, contiguous, the block's dtype), e.g. the RMSNorm of the decoder's block input, read
// from wherever that input lives. Ulysses and UPipe then project q, k and v, and form their weight
// gradients, tile by tile, and never hold x whole (rows is called once per tile for each stage's
// q, each round's k and v, in forward, in a recompute and in backward); the other strategies
// make x whole first. Results agree with the untiled block's to the summation order of the
// weight gradients' sums over rows (fp32 either way).
struct TiledInput {
  int64_t tile = 0;  // rows per call, >= 1
  std::function<void(int64_t r0, int64_t n, void* dst)> rows;
};

// The block's input gradient dx (L, E) handed out a tile of rows at a time instead of written
// whole (2-D chunking of dx): consume(r0, n, dx_rows) gets rows [r0, r0 + n) in fp32 (n, E,
// contiguous, on the device, valid during the call), n <= tile, every row once, in ascending
// order, after the backward's last exchange; consume may compute on the device but not call a
// collective. Ulysses and UPipe then keep each stage's returned q/k/v gradients (the block's
// dtype, (L, H + 2 G_eff, D) in all, in sequence layout) and form dx from them tile by tile, in
// the order the whole dx is summed in: the same bits, and no (L, E) fp32 accumulator. Local makes
// dx whole first.
//
// host: when set, the kept gradients wait in that allocator's memory (host memory the device can
// copy to and from: the decoder's, of offloaded block inputs) instead of on the device, each
// copied there as it returns and read back a tile of rows at a time (the same bits); what is on
// the device at once is then one stage's (or round's) exchange and the tiles.
struct TiledGrad {
  int64_t tile = 0;  // rows per call, >= 1
  std::function<void(int64_t r0, int64_t n, const float* dx_rows)> consume;
  Allocator* host = nullptr;
};

// The block's output y (L, E) handed out a tile of rows at a time instead of written whole (2-D
// chunking of the output projection): consume(r0, n, y_rows) gets rows [r0, r0 + n) (n, E,
// contiguous, on the device, the block's dtype, valid during the call), n <= tile, every row
// once, in ascending order, after the forward's last exchange; consume may compute on the device
// but not call a collective. Ulysses and UPipe project the attention output a tile of rows at a
// time, so the caller need not hold a whole y through the stages; local makes y whole first.
// Each row's values are those of the whole projection up to the GEMM's summation order (the same
// bits where the GEMM's order does not depend on the row count: the bf16 kernel, cuBLAS).
//
// host: when set (ulysses and upipe, with early_delta), the attention output saved for the
// backward (AttentionSaved::attn_out, (L, H*D)) is kept in that allocator's host memory instead
// of on the device: each stage's heads copied there as they return, and read back a tile of rows
// at a time by the output projection and by the backward (dwo, D). The same bits.
struct TiledOutput {
  int64_t tile = 0;  // rows per call, >= 1
  std::function<void(int64_t r0, int64_t n, const void* y_rows)> consume;
  Allocator* host = nullptr;
};

class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  // y (L, E) =.  Collective. `mask` is the sequence's documents and window (sequence_mask.h;
  // mask.seq() == S; the same on every rank); forward keeps a copy in `saved` for backward.
  virtual void forward(const Tensor& y, const Tensor& x, const AttentionWeights& w, const SequenceMask& mask,
                       AttentionSaved& saved) = 0;
  // The plain causal mask over the whole sequence.
  void forward(const Tensor& y, const Tensor& x, const AttentionWeights& w, AttentionSaved& saved) {
    forward(y, x, w, SequenceMask(config().seq), saved);
  }
  // dx (L, E) =; grads = (local partial sums). Collective. Frees `saved`.
  // dx is in the block's dtype, or f32 (then it is the fp32 accumulator: in a bf16 block this
  // saves the (L, E) fp32 scratch the block otherwise accumulates in).
  virtual void backward(const Tensor& dx, AttentionGrads& grads, const Tensor& dy, const Tensor& x,
                        const AttentionWeights& w, AttentionSaved& saved) = 0;
  // The same with x given by tiles (TiledInput): ulysses and upipe tile their projections, local
  // makes x whole first (Tag::kOther).
  virtual void forward(const Tensor& y, const TiledInput& x, const AttentionWeights& w, const SequenceMask& mask,
                       AttentionSaved& saved) = 0;
  virtual void backward(const Tensor& dx, AttentionGrads& grads, const Tensor& dy, const TiledInput& x,
                        const AttentionWeights& w, AttentionSaved& saved) = 0;
  // The same with dy given by tiles as well (TiledInput of dy's rows, e.g. read from host memory):
  // ulysses and upipe read it a tile at a time (the output projection's backward, dwo's sums over
  // tiles in fp32, D and each stage's dO), and never hold it whole; local makes it whole first.
  virtual void backward(const TiledGrad& dx, AttentionGrads& grads, const TiledInput& dy, const TiledInput& x,
                        const AttentionWeights& w, AttentionSaved& saved) = 0;
  // The same with y handed out by tiles (TiledOutput) and x given by tiles.
  virtual void forward(const TiledOutput& y, const TiledInput& x, const AttentionWeights& w, const SequenceMask& mask,
                       AttentionSaved& saved) = 0;
  // The same with dx handed out by tiles (TiledGrad): ulysses and upipe form it tile by tile;
  // local makes it whole (fp32, Tag::kOther) and then hands it out.
  virtual void backward(const TiledGrad& dx, AttentionGrads& grads, const Tensor& dy, const Tensor& x,
                        const AttentionWeights& w, AttentionSaved& saved) = 0;
  virtual void backward(const TiledGrad& dx, AttentionGrads& grads, const Tensor& dy, const TiledInput& x,
                        const AttentionWeights& w, AttentionSaved& saved) = 0;
  virtual const AttentionConfig& config() const = 0;
  // Heads per stage actually used (U; H for ulysses and local) and the number of stages.
  virtual int64_t stage_heads() const = 0;
  // Totals since the block was made.
  virtual RingStats ring_stats() const { return {}; }
};

// Validates (throws Error(kInvalidArgument) with validate()'s message) and builds the block.
std::unique_ptr<AttentionBlock> make_attention_block(Device& dev, Communicator& comm, const AttentionConfig& cfg);

}  // namespace untied

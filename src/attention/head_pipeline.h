// The staged sequence-sharded attention block behind kUlysses (one stage of all heads; q, k and v
// kept for the backward) and kUPipe (H/U stages, recomputed in the backward but for a kept last
// stage), with a ring across R groups for either (the hybrid), and kRing (C = 1). Both keep the
// attention output (sequence layout) and every stage's LSE. See head_pipeline.cc for the steps
// and their shapes.
#pragma once

#include <memory>
#include <vector>

#include "attention/block_ops.h"
#include "attention/ring_attention.h"
#include "untied/attention/attention_block.h"
#include "untied/attention/head_schedule.h"
#include "untied/kernels/attention.h"

namespace untied::attn {

// What forward keeps of each stage: everything (ulysses), or only the LSE, the rest recomputed
// by backward (upipe; but the last stage's q, k and v, AttentionSaved::keep_last_stage).
enum class Saving { kKeepStages, kRecompute };
// qk_norm: whether a projection keeps its pre-norm values and rstd (for backward) or frees them.
enum class KeepNorm { kNo, kYes };

class HeadPipeline final : public AttentionBlock {
 public:
  // REQUIRES: validate(cfg, comm.size()).ok().
  HeadPipeline(Device& dev, Communicator& comm, const AttentionConfig& cfg, Saving saving);
  void forward(const Tensor& y, const Tensor& x, const AttentionWeights& w, const SequenceMask& mask,
               AttentionSaved& saved) override;
  void backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x, const AttentionWeights& w,
                AttentionSaved& saved) override;
  void forward(const Tensor& y, const TiledInput& x, const AttentionWeights& w, const SequenceMask& mask,
               AttentionSaved& saved) override;
  void backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const TiledInput& x, const AttentionWeights& w,
                AttentionSaved& saved) override;
  void backward(const TiledGrad& dx, AttentionGrads& g, const TiledInput& dy, const TiledInput& x,
                const AttentionWeights& w, AttentionSaved& saved) override;
  void forward(const TiledOutput& y, const TiledInput& x, const AttentionWeights& w, const SequenceMask& mask,
               AttentionSaved& saved) override;
  void backward(const TiledGrad& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x, const AttentionWeights& w,
                AttentionSaved& saved) override;
  void backward(const TiledGrad& dx, AttentionGrads& g, const Tensor& dy, const TiledInput& x, const AttentionWeights& w,
                AttentionSaved& saved) override;
  const AttentionConfig& config() const override { return cfg_; }
  int64_t stage_heads() const override { return sched_.stage_heads; }
  RingStats ring_stats() const override { return ring_ != nullptr ? ring_->stats() : RingStats{}; }

 private:
  struct DoutStage;
  struct RoundGrads;
  struct DxStash;

  // forward and backward over either kind of input.
  // y whole (y), or handed out by tiles (tiled): exactly one is set.
  void run_forward(const Tensor* y, const TiledOutput* tiled, const InputRows& x, const AttentionWeights& w,
                   const SequenceMask& mask, AttentionSaved& saved);
  // run_forward with saved.output_kept (AttentionSaved): q, k, v projected again where the
  // strategy keeps them (ulysses, ring), no attention, y from the saved output.
  void rerun_forward(const Tensor* y, const TiledOutput* tiled, const InputRows& x, const AttentionWeights& w,
                     const SequenceMask& mask, AttentionSaved& saved);
  // y (L, E) = saved.attn_out (L, H*D) wo^T, whole or by tiles (exactly one of y, tiled set).
  void project_output(const Tensor* y, const TiledOutput* tiled, const AttentionWeights& w,
                      const AttentionSaved& saved);
  // dx whole (dx), or handed out by tiles (tiled): exactly one is set.
  // dy whole or by tiles (InputRows).
  void run_backward(const Tensor* dx, const TiledGrad* tiled, AttentionGrads& g, const InputRows& dy,
                    const InputRows& x, const AttentionWeights& w, AttentionSaved& saved);

  // The model's heads in block p's slots (in order): query heads at stage s, KV heads in round t.
  std::vector<int64_t> q_heads(int64_t s, int64_t p) const;
  std::vector<int64_t> kv_heads(int64_t t, int64_t p) const;
  // The same for every block p = 0 .. C-1 (project_blocks' heads).
  std::vector<std::vector<int64_t>> q_heads_of_blocks(int64_t s) const;
  std::vector<std::vector<int64_t>> kv_heads_of_blocks(int64_t t) const;
  // Send layouts on this rank: per destination rank p, L rows of `heads` heads.
  PackedHeads packed(void* base, int64_t heads, int64_t elem_bytes) const;
  PackedHeads packed(void* base, int64_t heads) const { return packed(base, heads, dtype_size(cfg_.dtype)); }

  // ---- forward steps (backward's recompute runs the first two again) ----
  // st.q (S, u, D) = all_to_all(RoPE(norm(x wq[stage s heads]^T)))     sequence -> heads
  // Each step that exchanges starts its all-to-alls in `ex` (block_ops.h): they are complete
  // once ex.wait() returns (at once without overlap).
  void project_q(const AttentionWeights& w, const InputRows& x, int64_t s, SavedStage& st, KeepNorm keep,
                 Exchanges& ex);
  // rd.k, rd.v (S, w, D) the same for the KV heads of round t (k normed and rotated)
  void project_kv(const AttentionWeights& w, const InputRows& x, int64_t t, SavedRound& rd, KeepNorm keep,
                  Exchanges& ex);
  // the receive [C][L][u][D] of all_to_all(o)                          heads -> sequence
  TensorBuffer start_output(const Tensor& o, Exchanges& ex);
  // attn_out[:, heads of stage s] = recv
  void place_output(int64_t s, const Tensor& recv, const Tensor& attn_out);
  // Rows [r0, r0 + n) of the saved attention output (n, H*D): in place, or, when it is in host
  // memory (AttentionSaved::attn_out_host_tile, n <= that tile), copied into `fetched`, the
  // buffer saved_output_fetch makes (empty otherwise).
  TensorBuffer saved_output_fetch(const AttentionSaved& saved) const;
  const char* saved_output_rows(const AttentionSaved& saved, int64_t r0, int64_t n, const TensorBuffer& fetched) const;

  // ---- backward steps, the forward's in reverse ----
  // dO (S, u, D) and D = rowsum(dO * O) for stage s, from dy:           sequence -> heads
  // delta_all: D of every head, (H, L) fp32 (early_delta), else null and D from attn_out.
  DoutStage start_dout(int64_t s, const InputRows& dy, const AttentionWeights& w, const Tensor& attn_out,
                       const Tensor* delta_all, Exchanges& ex);
  // After the exchange: D into the kernel's (u, S) layout.
  void finish_dout(DoutStage& d);
  // the receive [C][L][u][D] of all_to_all(dq)                          heads -> sequence
  TensorBuffer start_dq(TensorBuffer dq, Exchanges& ex);
  // After the exchange: dq through RoPE and the q norm, into dx and dwq; frees recv.
  // With a stash (TiledGrad) the gradient is kept there for dx instead of added into dx_acc.
  void finish_dq(int64_t s, TensorBuffer& recv, SavedStage& st, const AttentionWeights& w, const InputRows& x,
                 float* dx_acc, DxStash* stash, AttentionGrads& g, QkNorm& qk);
  // The round's dk/dv sums back to the sequence, through RoPE and the k norm, into dx, dwk, dwv
  // (blocking: once per round).
  void return_round_dkv(int64_t t, RoundGrads& acc, SavedRound& rd, const AttentionWeights& w, const InputRows& x,
                        float* dx_acc, DxStash* stash, AttentionGrads& g, QkNorm& qk);
  // dx from the stash a tile of rows at a time, summed in the order dx_acc is (stage by stage in
  // backward's order: the stage's q heads, then as a round is left its k heads and v heads),
  // handed to out.consume.
  void hand_out_dx(const TiledGrad& out, const DxStash& stash, const AttentionWeights& w);

  // The stage backward runs i-th: the last first (upipe's forward keeps the last stage's inputs).
  int64_t backward_stage(int64_t i) const { return sched_.stages - 1 - i; }

  // The kernels' shape and the RoPE positions of this rank's rows and of its group sequence, under
  // the mask of the pass in progress (mask_).
  AttentionShape kernel_shape() const;
  RowPositions rank_rows() const;
  RowPositions group_rows() const;

  Device& dev_;
  AttentionConfig cfg_;
  Saving saving_;
  bool overlap_;                          // cfg.overlap with more than one stage
  TokenLayout layout_;
  // With a ring (R > 1): this rank's Ulysses group (C consecutive ranks) and its ring (the ranks
  // of the same place in every group). Without, the all-to-all runs over the whole communicator.
  std::unique_ptr<Communicator> group_comm_, ring_comm_;
  Communicator* ulysses_;                 // the all-to-all group
  std::unique_ptr<RingAttention> ring_;   // R > 1 only
  HeadSchedule sched_;
  int64_t rows_;                          // L
  int64_t seq_group_;                     // rows after the all-to-all: S / R (S without a ring)
  std::vector<TokenSegment> positions_;   // this rank's rows (one or two runs of positions)
  std::vector<TokenSegment> group_positions_;  // the group sequence's rows
  const SavedMask* mask_ = nullptr;        // the mask of the forward or backward in progress
};

}  // namespace untied::attn

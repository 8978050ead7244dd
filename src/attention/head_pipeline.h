// The staged sequence-sharded attention block behind kUlysses (one stage of all heads, saved
// q/k/v/out) and kUPipe (H/U stages, recompute in backward). See head_pipeline.cc.
#pragma once

#include <vector>

#include "untied/attention/attention_block.h"
#include "untied/attention/head_schedule.h"
#include "untied/kernels/attention.h"

namespace untied::attn {

class HeadPipeline final : public AttentionBlock {
 public:
  // REQUIRES: validate(cfg, comm.size()).ok().
  HeadPipeline(Device& dev, Communicator& comm, const AttentionConfig& cfg, bool recompute);
  void forward(const Tensor& y, const Tensor& x, const AttentionWeights& w, AttentionSaved& saved) override;
  void backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x, const AttentionWeights& w,
                AttentionSaved& saved) override;
  const AttentionConfig& config() const override { return cfg_; }
  int64_t stage_heads() const override { return sched_.stage_heads; }

 private:
  struct Stage;
  // Projects stage s's query heads (and, when kv, the round's K/V heads) from x (L, E) into
  // send layout, applies RoPE, exchanges into st.q_recv (and st.k_res, st.v_res).
  // keep_pre (qk_norm): keep the pre-norm projections and rstd in st for backward.
  void project_exchange(const AttentionWeights& w, const Tensor& x, int64_t s, bool kv, Stage& st, bool keep_pre);
  AttentionShape kernel_shape() const;

  Device& dev_;
  Communicator& comm_;
  AttentionConfig cfg_;
  bool recompute_;
  HeadSchedule sched_;
  int64_t rows_;  // L
  int64_t first_position_ = 0;  // global position of this rank's first token
};

}  // namespace untied::attn

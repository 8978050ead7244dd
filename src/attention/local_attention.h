// The `local` strategy (one rank): see attention_block.h.
#pragma once

#include <vector>

#include "untied/attention/attention_block.h"
#include "attention/block_ops.h"
#include "untied/kernels/attention.h"

namespace untied::attn {

class LocalAttention final : public AttentionBlock {
 public:
  LocalAttention(Device& dev, const AttentionConfig& cfg);
  void forward(const Tensor& y, const Tensor& x, const AttentionWeights& w, const SequenceMask& mask,
               AttentionSaved& saved) override;
  void backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x, const AttentionWeights& w,
                AttentionSaved& saved) override;
  // x made whole, then the above.
  void forward(const Tensor& y, const TiledInput& x, const AttentionWeights& w, const SequenceMask& mask,
               AttentionSaved& saved) override {
    forward(y, whole_input(dev_, x, cfg_.seq, cfg_.hidden, cfg_.dtype), w, mask, saved);
  }
  void backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const TiledInput& x, const AttentionWeights& w,
                AttentionSaved& saved) override {
    backward(dx, g, dy, whole_input(dev_, x, cfg_.seq, cfg_.hidden, cfg_.dtype), w, saved);
  }
  // dy made whole, then the above.
  void backward(const TiledGrad& dx, AttentionGrads& g, const TiledInput& dy, const TiledInput& x,
                const AttentionWeights& w, AttentionSaved& saved) override {
    const TensorBuffer whole = whole_input(dev_, dy, cfg_.seq, cfg_.hidden, cfg_.dtype);
    backward(dx, g, whole.view(), x, w, saved);
  }
  // y and x made whole.
  void forward(const TiledOutput& y, const TiledInput& x, const AttentionWeights& w, const SequenceMask& mask,
               AttentionSaved& saved) override {
    hand_out_whole_output(dev_, y, cfg_.seq, cfg_.hidden, cfg_.dtype,
                          [&](const Tensor& whole) { forward(whole, x, w, mask, saved); });
  }
  // dx made whole, then handed out by tiles.
  void backward(const TiledGrad& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x, const AttentionWeights& w,
                AttentionSaved& saved) override {
    hand_out_whole(dev_, dx, cfg_.seq, cfg_.hidden, [&](const Tensor& whole) { backward(whole, g, dy, x, w, saved); });
  }
  void backward(const TiledGrad& dx, AttentionGrads& g, const Tensor& dy, const TiledInput& x, const AttentionWeights& w,
                AttentionSaved& saved) override {
    hand_out_whole(dev_, dx, cfg_.seq, cfg_.hidden, [&](const Tensor& whole) { backward(whole, g, dy, x, w, saved); });
  }
  const AttentionConfig& config() const override { return cfg_; }
  int64_t stage_heads() const override { return cfg_.heads; }

 private:
  AttentionShape kernel_shape(const SavedMask& m) const;
  RowPositions rope_positions(const SavedMask& m) const { return {.segments = &rows_, .table = m.rope_rows.as<int64_t>()}; }
  Device& dev_;
  AttentionConfig cfg_;
  std::vector<TokenSegment> rows_;  // the whole sequence, one run
};

}  // namespace untied::attn

// One decoder step on in-process ranks, for the model tests (tests/common): every rank gets a CPU
// device of one thread, its ZeRO shard of the parameters (filled by the caller), and its L = S/C
// tokens; forward_backward runs once; the loss (summed over ranks, divided by the labelled
// tokens of the whole sequence) and every parameter's full gradient (the shards gathered) come
// back from rank 0.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "untied/dist/sharded_params.h"
#include "untied/model/decoder.h"

namespace untied::test {

struct DecoderStep {
  double loss = 0;                        // mean over the labelled tokens of the sequence (+ router_aux)
  std::vector<std::vector<float>> grads;  // per parameter, full (descriptor order)
  double router_aux = 0;                  // a MoE model's coef * load-balancing loss (in `loss` too)
  std::vector<double> expert_load;        // StepSums::expert_load
  int64_t moe_sent_bytes = 0;             // rank 0's StepSums::moe_sent_bytes
};

// Fills rank `rank`'s shard of the parameters (master copies) before the step.
using ParamsInit = std::function<void(ShardedParams& params, int rank)>;

// REQUIRES: tokens.size() == labels.size() == o.seq. Any o.seq: the decoder pads it (no labels on
// the padding). doc_lens (summing to o.seq; empty = one document) and window: the sequence mask.
DecoderStep run_decoder_step(const ModelConfig& m, const DecoderOptions& o, int ranks,
                             const std::vector<int32_t>& tokens, const std::vector<int32_t>& labels,
                             const ParamsInit& init, const std::vector<int64_t>& doc_lens = {}, int64_t window = 0);

// A ParamsInit that copies full parameters (descriptor order) into each rank's shard.
ParamsInit params_from(const std::vector<std::vector<float>>& full);

}  // namespace untied::test

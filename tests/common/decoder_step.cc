// The decoder step of decoder_step.h.
#include "common/decoder_step.h"

#include <mutex>

#include "untied/comm/inproc.h"
#include "untied/device/device.h"

namespace untied::test {

DecoderStep run_decoder_step(const ModelConfig& m, const DecoderOptions& o, int ranks,
                             const std::vector<int32_t>& tokens, const std::vector<int32_t>& labels,
                             const ParamsInit& init, const std::vector<int64_t>& doc_lens, int64_t window) {
  int64_t global = 0;  // labelled tokens of the whole sequence
  for (int32_t l : labels) global += l != -100;
  const auto descs = parameter_descriptors(m);
  DecoderStep out;
  std::mutex mu;
  run_in_process(ranks, [&](Communicator& comm) {
    auto dev = make_cpu_device({.threads = 1});
    ShardedParams params(*dev, comm, descs, o.dtype, ShardedState::kTraining, experts_parallel(m, o, ranks));
    init(params, comm.rank());
    Decoder dec(*dev, comm, m, o);
    // This rank's positions (token_layout.h: one run, or two under a ring), gathered in row order;
    // positions past S are padding (token 0, no label).
    const int64_t Sp = dec.geometry().Sp, L = dec.geometry().L;
    std::vector<int32_t> my_tokens(static_cast<size_t>(L), 0), my_labels(static_cast<size_t>(L), -100);
    for (const TokenSegment& seg : dec.geometry().layout.rank_segments(comm.rank()))
      for (int64_t i = 0; i < seg.length && seg.first_position + i < o.seq; ++i) {
        my_tokens[seg.first_row + i] = tokens[seg.first_position + i];
        my_labels[seg.first_row + i] = labels[seg.first_position + i];
      }
    const SequenceMask mask =
        (doc_lens.empty() ? SequenceMask(o.seq, window) : SequenceMask::from_lengths(doc_lens, window).value())
            .padded_to(Sp);
    StepSums s = dec.forward_backward(params, my_tokens.data(), my_labels.data(), nullptr, global, mask);
    double loss = s.loss_sum;
    comm.all_reduce(&loss, &loss, 1, DType::kF64, ReduceOp::kSum);
    std::vector<std::vector<float>> full(params.num_params());
    for (int i = 0; i < params.num_params(); ++i) {
      const int64_t sh = params.shard_elems(i);
      full[i].resize(static_cast<size_t>(sh * ranks));
      comm.all_gather(params.grad(i), full[i].data(), sh * 4);
      full[i].resize(static_cast<size_t>(descs[i].shape.numel()));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) {
      out.loss = loss / static_cast<double>(global) + s.router_aux;
      out.router_aux = s.router_aux;
      out.expert_load = s.expert_load;
      out.moe_sent_bytes = s.moe_sent_bytes;
      out.grads = std::move(full);
    }
  });
  return out;
}

ParamsInit params_from(const std::vector<std::vector<float>>& full) {
  return [&full](ShardedParams& params, int rank) {
    for (int i = 0; i < params.num_params(); ++i) {
      const int64_t start = params.shard_elems(i) * rank;
      for (int64_t k = 0; k < params.owned_elems(i); ++k) params.master(i)[k] = full[i][start + k];
    }
  };
}

}  // namespace untied::test

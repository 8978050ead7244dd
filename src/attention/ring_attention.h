// Zig-zag ring attention of one stage's heads over a ring group of R ranks (paper §3.8).
//
// Ring rank j holds its group sequence (token_layout.h): Sg = S / R rows, chunk j (Lc = S / (2R)
// rows at positions j*Lc ..) then chunk 2R-1-j, for the stage's heads: q (Sg, u, D), k and v
// (Sg, w, D), head-sharded, the same heads on every member of the ring (with GQA only the w KV
// heads travel, never a copy per query head).
//
// forward: K and V travel around the ring, packed into one buffer: at step t rank j holds the
// block of ring rank j - t, and the exchange of the next block is in flight while the current one
// is attended to (Communicator::sendrecv_start). Each (q chunk, k chunk) pair that the causal mask
// does not remove entirely is one flash-attention call with the chunks' global offsets, giving
// fp32 partial results (AttentionShape::f32_results) merged with the log-sum-exp rule
// (attention_merge); the first result of each q chunk (its own block) is written in place.
//
// backward: K and V travel again; each step's dk/dv partial sums, in fp32, follow one step
// behind them (sent after the step's compute, received while the next step computes) and reach
// the block's owner after R steps; dq accumulates locally in fp32.
//
// Memory: every buffer from the device allocator: the travelling K/V blocks and dk/dv sums
// kCommunication, accumulators and partial results kAttnWorkspace. In rehearsal nothing is
// exchanged (buffers are counted, not backed).
#pragma once

#include <cstdint>

#include "untied/attention/attention_block.h"
#include "untied/attention/token_layout.h"
#include "untied/comm/communicator.h"
#include "untied/core/tensor.h"
#include "untied/device/device.h"
#include "untied/kernels/attention.h"

namespace untied::attn {

class RingAttention {
 public:
  // ring: the R members of this rank's ring (rank j of it = ring group j). REQUIRES R > 1.
  // overlap false: every exchange is waited for as soon as it starts (measures its whole cost).
  RingAttention(Device& dev, Communicator& ring, const TokenLayout& layout, int64_t heads, int64_t kv_heads,
                int64_t head_dim, DType dtype, bool overlap = true);

  // out (Sg, u, D) =, lse (u, Sg) fp32 =, from q (Sg, u, D), k, v (Sg, w, D). Collective.
  // `mask`: the sequence's documents and window (sequence_mask.h, SavedMask), global positions.
  void forward(const SavedMask& mask, void* out, float* lse, const void* q, const void* k, const void* v);
  // dq (Sg, u, D) =; dk_acc, dv_acc (Sg, w, D) fp32 += (this rank's K/V block, summed over the
  // ring); from q, k, v, D = rowsum(dO * O) and lse (u, Sg) fp32, and dout (Sg, u, D). Collective.
  void backward(const SavedMask& mask, void* dq, float* dk_acc, float* dv_acc, const void* q, const void* k, const void* v,
                const float* delta, const float* lse, const void* dout);

  const RingStats& stats() const { return stats_; }

 private:
  // The flash call of q chunk qi of this rank against k chunk ki of ring rank jt, or false when
  // the mask (causal, documents, window) removes the pair entirely.
  bool pair_shape(const SavedMask& mask, int qi, int jt, int ki, AttentionShape* s) const;
  // k and v into one buffer [k (Sg, w, D) | v (Sg, w, D)], the unit that travels.
  TensorBuffer pack_kv(const void* k, const void* v, const char* what);
  // Starts the exchange of `send` (bytes) to the next ring rank and of the previous one's into recv.
  std::unique_ptr<PendingExchange> pass_on(const void* send, void* recv, int64_t bytes);
  void wait(std::unique_ptr<PendingExchange>& p);

  Device& dev_;
  Communicator& ring_;
  TokenLayout layout_;
  int R_, j_;
  int64_t sg_, lc_, u_, w_, d_;
  DType t_;
  bool overlap_;
  RingStats stats_;
};

}  // namespace untied::attn

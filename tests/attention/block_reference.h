// A naive implementation of the whole attention block (attention_block.h), written for clarity,
// not speed, and sharing no code with src/: the reference every strategy is judged against.
//
// T = double is THE reference. T = float is the same formula, same loop order, in fp32; it is
// used only to measure what a straightforward fp32 computation of the block costs in accuracy
// (the baseline of the tolerance for `local` itself, STYLE.md habit 8).
//
// One rank, the whole sequence, dense row-major tensors in the header's layouts:
//   x, y, dx, dy (S, E)    wq, dwq (H*D, E)    wk, wv, dwk, dwv (G*D, E)    wo, dwo (E, H*D)
// Forward: q = x wq^T, k = x wk^T, v = x wv^T; RoPE (Hugging Face rotate_half) on q and k at
// positions 0..S-1 (restarting at each document) with the given theta (angles in double in both
// instantiations); causal softmax attention within each document and window, with scale
// 1/sqrt(D), query head h reading KV head h / (H/G);
// y = attn wo^T.
// Backward: the exact gradient of sum(dy * y) with respect to x and the four weights.
#pragma once

#include <cstdint>
#include <vector>

namespace untied::blockref {

struct BlockDims {
  int64_t seq = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;  // S, E, H, G, D
  double theta = 10000.0;
  // Packed documents (lengths summing to S; empty = one document): a token attends only to the
  // tokens of its own document, and RoPE positions restart at 0 with each. window > 0: a query
  // at i sees keys j > i - window only.
  std::vector<int64_t> doc_lens = {};
  int64_t window = 0;
};

template <typename T>
struct BlockWeights {
  std::vector<T> wq, wk, wv, wo;
};

template <typename T>
struct BlockGrads {
  std::vector<T> dx, dwq, dwk, dwv, dwo;
};

// y (S, E) =.
template <typename T>
std::vector<T> block_forward(const BlockDims& d, const std::vector<T>& x, const BlockWeights<T>& w);

// g = gradients of sum(dy * y(x, w)) (all overwritten).
template <typename T>
void block_backward(const BlockDims& d, const std::vector<T>& x, const BlockWeights<T>& w,
                    const std::vector<T>& dy, BlockGrads<T>& g);

}  // namespace untied::blockref

// A mixture-of-experts MLP (model_config.h: experts X, experts_per_token k, expert_ffn Fe) over
// one tile of n rows, forward and backward over named buffers, and its router's arithmetic.
//
//   logits (n, X) = b router^T (fp32);  p = softmax(logits) (fp32, per row)
//   ids (n, k): the k largest p of each row (ties to the lower expert), w (n, k) their p, divided
//               by their sum with norm_topk_prob
//   out (n, E) += sum_j w[r, j] * expert_{ids[r, j]}(b[r]),  expert_e(x) = w_down_e(silu(w_gate_e x) * w_up_e x)
//
// The tile's rows are gathered into expert order (xs, m = n k rows: expert 0's rows first, each
// expert's in row order), each expert runs as one GEMM per projection over its rows, and the
// outputs are combined back per token in fp32 (kernels/moe.h). Every buffer is sized by m, not by
// the routing, so a tile's memory is the same whatever the router chooses. The routing is
// computed on the host from the logits (n X floats a tile), and a recompute is handed the
// forward's ids, so that the backward sees the experts the forward used.
//
// The load-balancing loss (transformers' load_balancing_loss_func, its router logits of every MoE
// layer concatenated): over the N rows of every MoE layer of the sequence (padding excluded),
//   aux = X * sum_e f_e P_e,   f_e = (picks of e) / N,   P_e = (sum of p_e) / N,
// f carrying no gradient; the loss adds router_aux_coef * aux, so d loss / d p[row, e] =
// coef X f_e / N for every row (aux_grad). Tags: every buffer Tag::kOther.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "untied/comm/communicator.h"
#include "untied/core/tensor.h"
#include "untied/device/device.h"
#include "untied/model/model_config.h"
#include "untied/model/parameters.h"

namespace untied {

// The host side of the router. logits (n, X); ids, weights (n, k); probs (n, X) (nullable).
// With use_ids the ids are given (a recompute) and only the weights and probs are computed.
void route_rows(const float* logits, int64_t n, int64_t X, int64_t k, bool norm, bool use_ids, int32_t* ids,
                float* weights, float* probs);
// dlogits (n, X) from d loss / d weights (dweights, (n, k)) through the weights' normalisation and
// the softmax, with aux_grad[e] (X, nullable) added to d loss / d p[r, e] of each real row.
void route_rows_backward(const float* probs, const int32_t* ids, const float* dweights, int64_t n, int64_t X, int64_t k,
                         bool norm, const float* aux_grad, const uint8_t* real, float* dlogits);

// One MoE layer's routing statistics over its real rows (this rank's, or summed over ranks).
struct MoeLayerStats {
  std::vector<double> picks;     // (X) rows routed to each expert
  std::vector<double> prob_sum;  // (X) the router's probability of each expert, summed over rows
  double rows = 0;
};

// The load-balancing loss of the MoE layers' statistics (summed over ranks), and aux_grad (X):
// d (coef * aux) / d p of each expert, for every real row of every MoE layer.
double load_balancing_loss(const std::vector<MoeLayerStats>& layers, int64_t X, double coef,
                           std::vector<float>* aux_grad);

class MoeMlp {
 public:
  // ep: expert parallelism over these ranks (m.experts a multiple of their number): this rank
  // holds experts [r X / P, (r + 1) X / P) (the BlockWeights' e_* are those, (X / P, ...)), each
  // tile's rows go to their experts' ranks and come back (Communicator::all_to_allv: the counts
  // first, so every receive is sized from them); null: every expert here (e_* (X, ...)). With
  // ep, forward and backward are collective over its ranks, tile by tile.
  // skew: a rehearsal's received rows, as DecoderOptions::moe_skew.
  MoeMlp(Device& dev, const ModelConfig& m, DType t, Communicator* ep, double skew = 1.0);
  // out (n, E) += moe(b), b (n, E) the tile's normed input. ids (n, k): filled with the router's
  // choice, or (use_ids) the forward's to follow. stats (nullable): the real rows' picks and
  // probabilities added. real: n flags (null: every row real).
  void forward(const BlockWeights& w, const Tensor& b, const Tensor& out, int32_t* ids, bool use_ids,
               MoeLayerStats* stats, const uint8_t* real);
  // db (n, E) = the gradient of b from dy (n, E), that of out (written, not added); the router's
  // and the experts' gradients added into g (fp32). ids: the forward's; aux_grad (X): as
  // load_balancing_loss gives it.
  void backward(const BlockWeights& w, const BlockWeights& g, const Tensor& b, const Tensor& dy, const Tensor& db,
                const int32_t* ids, const std::vector<float>& aux_grad, const uint8_t* real);
  // Bytes this rank has sent to other ranks in the experts' all-to-alls since the last take.
  int64_t take_sent_bytes() { return std::exchange(sent_bytes_, 0); }

  // A run of rows of one expert (its index among this rank's experts) in an expert-side buffer.
  struct Segment {
    int64_t expert = 0, first = 0, rows = 0;
  };

 private:
  // What forward and backward share for a tile: the logits on the host, the routing, and the
  // rows in expert order (idx, pos, counts), uploaded.
  struct Routing;
  Routing route(const BlockWeights& w, const Tensor& b, int32_t* ids, bool use_ids);
  // What forward and backward both make at the experts: the tile's rows in expert order (at the
  // experts' ranks with ep) and their gate and up projections, (M, Fe) each.
  struct ExpertInputs {
    TensorBuffer xs, gate, up;
  };
  ExpertInputs expert_inputs(const Routing& R, const BlockWeights& w, const Tensor& b);
  // Expert parallelism: rows (dim elements of t each) in expert order to the experts' ranks
  // (to_experts), or the experts' rows back; the received rows in a new buffer (Tag::kCommunication).
  TensorBuffer exchange_rows(const Routing& R, const void* rows, int64_t dim, DType t, bool to_experts, const char* what);
  // Expert parallelism, collective: past the rows planned for a tile of m rows, the extra rows'
  // buffers must fit in the allocator's budget on every rank, or every rank fails together
  // (Error kOutOfBudget) before any of them is allocated.
  void check_received(int64_t received, int64_t m);
  Device& dev_;
  ModelConfig m_;
  DType t_;
  Communicator* ep_;
  int64_t local_experts_;  // X', the experts this rank runs
  double skew_;
  int64_t sent_bytes_ = 0;
};

}  // namespace untied

// The mixture-of-experts MLP: see moe.h.
#include "untied/model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "untied/core/check.h"
#include "untied/kernels/gemm.h"
#include "untied/kernels/moe.h"
#include "untied/kernels/swiglu.h"
#include "untied/kernels/tensor_ops.h"
#include "untied/model/decoder_options.h"

namespace untied {

void route_rows(const float* logits, int64_t n, int64_t X, int64_t k, bool norm, bool use_ids, int32_t* ids,
                float* weights, float* probs) {
  std::vector<float> p(static_cast<size_t>(X));
  std::vector<int32_t> order(static_cast<size_t>(X));
  for (int64_t r = 0; r < n; ++r) {
    const float* l = logits + r * X;
    const float mx = *std::max_element(l, l + X);
    float sum = 0.0f;
    for (int64_t e = 0; e < X; ++e) sum += p[static_cast<size_t>(e)] = std::exp(l[e] - mx);
    for (float& v : p) v /= sum;
    if (probs != nullptr) std::copy(p.begin(), p.end(), probs + r * X);
    int32_t* id = ids + r * k;
    if (!use_ids) {
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] ||
               (p[static_cast<size_t>(a)] == p[static_cast<size_t>(b)] && a < b);
      });
      std::copy(order.begin(), order.begin() + k, id);
    }
    float z = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      UNTIED_CHECK(id[j] >= 0 && id[j] < X, "moe routing: expert ", id[j], " of row ", r, " is not one of ", X);
      z += p[static_cast<size_t>(id[j])];
    }
    for (int64_t j = 0; j < k; ++j) weights[r * k + j] = norm ? p[static_cast<size_t>(id[j])] / z : p[static_cast<size_t>(id[j])];
  }
}

void route_rows_backward(const float* probs, const int32_t* ids, const float* dweights, int64_t n, int64_t X, int64_t k,
                         bool norm, const float* aux_grad, const uint8_t* real, float* dlogits) {
  std::vector<double> dp(static_cast<size_t>(X));
  for (int64_t r = 0; r < n; ++r) {
    const float* p = probs + r * X;
    const int32_t* id = ids + r * k;
    const float* dw = dweights + r * k;
    std::fill(dp.begin(), dp.end(), 0.0);
    if (norm) {  // w_j = p_j / z, z = sum_i p_i over the chosen: dp_i = (dw_i - sum_j dw_j w_j) / z
      double z = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) z += p[id[j]];
      for (int64_t j = 0; j < k; ++j) dot += dw[j] * (p[id[j]] / z);
      for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(id[j])] += (dw[j] - dot) / z;
    } else {
      for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(id[j])] += dw[j];
    }
    if (aux_grad != nullptr && (real == nullptr || real[r]))
      for (int64_t e = 0; e < X; ++e) dp[static_cast<size_t>(e)] += aux_grad[e];
    double s = 0;  // the softmax's backward: dl_e = p_e (dp_e - sum_f p_f dp_f)
    for (int64_t e = 0; e < X; ++e) s += p[e] * dp[static_cast<size_t>(e)];
    for (int64_t e = 0; e < X; ++e) dlogits[r * X + e] = static_cast<float>(p[e] * (dp[static_cast<size_t>(e)] - s));
  }
}

double load_balancing_loss(const std::vector<MoeLayerStats>& layers, int64_t X, double coef,
                           std::vector<float>* aux_grad) {
  std::vector<double> picks(static_cast<size_t>(X), 0.0), prob(static_cast<size_t>(X), 0.0);
  double rows = 0;
  for (const MoeLayerStats& l : layers) {
    for (int64_t e = 0; e < X; ++e) {
      picks[static_cast<size_t>(e)] += l.picks[static_cast<size_t>(e)];
      prob[static_cast<size_t>(e)] += l.prob_sum[static_cast<size_t>(e)];
    }
    rows += l.rows;
  }
  aux_grad->assign(static_cast<size_t>(X), 0.0f);
  if (rows == 0) return 0.0;
  double aux = 0;
  for (int64_t e = 0; e < X; ++e) {
    const double f = picks[static_cast<size_t>(e)] / rows;
    aux += f * (prob[static_cast<size_t>(e)] / rows);
    (*aux_grad)[static_cast<size_t>(e)] = static_cast<float>(coef * static_cast<double>(X) * f / rows);
  }
  return static_cast<double>(X) * aux;
}

struct MoeMlp::Routing {
  std::vector<float> probs, weights;  // host: (n, X), (n, k)
  std::vector<int64_t> count, offset;  // per expert (X): the tile's rows, and where they start in expert order
  TensorBuffer idx, pos, w;            // device: (m) source row, (n, k) row in expert order, (n, k) weights
  // Expert parallelism: the rows each rank sends (its experts' rows, in expert order) and
  // receives, in bytes of one element a row (scaled per buffer), and the received rows' segments.
  std::vector<int64_t> send_rows, recv_rows;
  int64_t received = 0;  // M: rows this rank's experts process
  std::vector<Segment> segments;
};

MoeMlp::MoeMlp(Device& dev, const ModelConfig& m, DType t, Communicator* ep, double skew)
    : dev_(dev), m_(m), t_(t), ep_(ep), local_experts_(ep != nullptr ? m.experts / ep->size() : m.experts),
      skew_(skew) {
  UNTIED_CHECK(ep == nullptr || m.experts % ep->size() == 0, "moe: ", m.experts, " experts over ", ep->size(),
               " ranks: expert parallelism needs a multiple of the ranks");
}

MoeMlp::Routing MoeMlp::route(const BlockWeights& w, const Tensor& b, int32_t* ids, bool use_ids) {
  const int64_t n = b.dim(0), E = m_.hidden, X = m_.experts, k = m_.experts_per_token, m = n * k;
  Allocator& alloc = dev_.allocator();
  Routing R;
  std::vector<float> logits_host(static_cast<size_t>(n * X));
  {
    TensorBuffer logits(alloc, DType::kF32, {n, X}, Tag::kOther, "moe router logits (tile)");
    gemm(dev_, GemmParams{.trans_b = true, .m = n, .n = X, .k = E, .a = b.data(), .lda = E, .a_dtype = t_,
                          .b = w.router.data(), .ldb = E, .b_dtype = t_, .c = logits.data(), .ldc = X});
    if (dev_.backed()) dev_.copy(logits_host.data(), logits.data(), logits.view().bytes());
  }
  R.probs.resize(static_cast<size_t>(n * X));
  R.weights.resize(static_cast<size_t>(m));
  R.count.assign(static_cast<size_t>(X), 0);
  std::vector<int32_t> idx(static_cast<size_t>(m)), pos(static_cast<size_t>(m));
  if (dev_.backed()) {
    route_rows(logits_host.data(), n, X, k, m_.norm_topk_prob, use_ids, ids, R.weights.data(), R.probs.data());
    for (int64_t i = 0; i < m; ++i) ++R.count[static_cast<size_t>(ids[i])];
  } else {  // rehearsal: nothing is routed; the experts take the balanced split (moe.h)
    for (int64_t e = 0; e < X; ++e) R.count[static_cast<size_t>(e)] = moe_balanced_share(m, X, e);
  }
  R.offset.assign(static_cast<size_t>(X), 0);
  for (int64_t e = 1; e < X; ++e)
    R.offset[static_cast<size_t>(e)] = R.offset[static_cast<size_t>(e - 1)] + R.count[static_cast<size_t>(e - 1)];
  if (dev_.backed()) {
    std::vector<int64_t> next = R.offset;  // expert order, each expert's rows in row order
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = next[static_cast<size_t>(ids[r * k + j])]++;
        idx[static_cast<size_t>(p)] = static_cast<int32_t>(r);
        pos[static_cast<size_t>(r * k + j)] = static_cast<int32_t>(p);
      }
  }
  R.idx = TensorBuffer(alloc, DType::kI32, {m}, Tag::kOther, "moe rows in expert order (tile)");
  R.pos = TensorBuffer(alloc, DType::kI32, {n, k}, Tag::kOther, "moe row of each token's expert (tile)");
  R.w = TensorBuffer(alloc, DType::kF32, {n, k}, Tag::kOther, "moe routing weights (tile)");
  dev_.copy(R.idx.data(), idx.data(), R.idx.view().bytes());
  dev_.copy(R.pos.data(), pos.data(), R.pos.view().bytes());
  dev_.copy(R.w.data(), R.weights.data(), R.w.view().bytes());
  const int64_t Xl = local_experts_;
  if (ep_ == nullptr) {  // every expert here: the rows in expert order are the experts' own
    R.received = m;
    for (int64_t e = 0; e < X; ++e)
      R.segments.push_back(Segment{.expert = e, .first = R.offset[static_cast<size_t>(e)],
                                   .rows = R.count[static_cast<size_t>(e)]});
    return R;
  }
  // Expert parallelism: how many rows each rank's experts get from each rank (one all_to_all of
  // the counts), so that every receive is sized before the rows move.
  const int P = ep_->size();
  std::vector<int64_t> got(static_cast<size_t>(X));
  if (dev_.backed()) ep_->all_to_all(R.count.data(), got.data(), Xl * 8);
  else  // rehearsal: every rank sends the balanced split, and each expert gets it times the skew
    for (int64_t e = 0; e < X; ++e) got[static_cast<size_t>(e)] = moe_skewed(R.count[static_cast<size_t>(e)], skew_);
  R.send_rows.assign(static_cast<size_t>(P), 0);
  R.recv_rows.assign(static_cast<size_t>(P), 0);
  for (int p = 0; p < P; ++p)
    for (int64_t j = 0; j < Xl; ++j) {
      const size_t e = static_cast<size_t>(p * Xl + j);
      R.send_rows[static_cast<size_t>(p)] += R.count[e];
      R.segments.push_back(Segment{.expert = j, .first = R.received, .rows = got[e]});
      R.recv_rows[static_cast<size_t>(p)] += got[e];
      R.received += got[e];
    }
  if (dev_.backed()) check_received(R.received, m);
  return R;
}

void MoeMlp::check_received(int64_t received, int64_t m) {
  // The rows planned for (moe_planned_rows: balanced, times the skew); past them, the rows'
  // buffers at the experts (input and output rows, gate, up and SwiGLU, the fp32 input gradient:
  // more than are ever live at once) must fit in what the budget has left, or every rank stops
  // here together.
  const int64_t E = m_.hidden, Fe = m_.expert_ffn, es = dtype_size(t_);
  const int64_t planned = moe_skewed_total(m, m_.experts, skew_);
  const Allocator& alloc = dev_.allocator();
  const int64_t need = received > planned ? received * (2 * E * es + 3 * Fe * es + E * 4) : 0;
  const int64_t left = alloc.budget_bytes() > 0 ? alloc.budget_bytes() - alloc.stats().live_total : INT64_MAX;
  int64_t over[2] = {need > left ? received : 0, need > left ? ep_->rank() : -1};
  ep_->all_reduce(over, over, 2, DType::kI64, ReduceOp::kMax);
  if (over[0] > 0)
    fail(ErrorKind::kOutOfBudget,
         str_cat("expert parallelism: the router sent rank ", over[1], "'s experts ", over[0], " rows of one tile, ",
                 "against the ", planned, " planned (the balanced share times --moe-skew ", skew_,
                 "), and their buffers do not fit in --mem-budget: raise --moe-skew (and plan with it), lower "
                 "--mlp-tile, use more ranks, or raise --mem-budget"));
}

TensorBuffer MoeMlp::exchange_rows(const Routing& R, const void* rows, int64_t dim, DType t, bool to_experts,
                                   const char* what) {
  const std::vector<int64_t>& out = to_experts ? R.send_rows : R.recv_rows;
  const std::vector<int64_t>& in = to_experts ? R.recv_rows : R.send_rows;
  int64_t total = 0;
  std::vector<int64_t> send_bytes, recv_bytes;
  for (size_t p = 0; p < out.size(); ++p) {
    send_bytes.push_back(out[p] * dim * dtype_size(t));
    recv_bytes.push_back(in[p] * dim * dtype_size(t));
    total += in[p];
    if (static_cast<int>(p) != ep_->rank()) sent_bytes_ += send_bytes.back();
  }
  TensorBuffer recv(dev_.allocator(), t, {total, dim}, Tag::kCommunication, what);
  if (dev_.backed()) ep_->all_to_allv(rows, send_bytes, recv.data(), recv_bytes);
  return recv;
}

namespace {
// For each segment (an expert's rows): C rows [first, first + rows) of c (ldc) = the same rows
// of a (lda) times the expert's matrix of `stacked` (X', rows_w, cols_w): trans_b (A W^T, A
// (rows, cols_w)) or not (A W, A (rows, rows_w)); beta as given; out dtype c_t. One grouped
// GEMM for every expert's rows (kernels/gemm.h gemm_grouped).
void per_expert(Device& dev, const std::vector<MoeMlp::Segment>& segs, bool trans_b, const void* a, int64_t lda,
                DType a_t, const Tensor& stacked, void* c, int64_t ldc, DType c_t, float beta = 0.0f) {
  const int64_t rw = stacked.dim(1), cw = stacked.dim(2), es = dtype_size(stacked.dtype());
  std::vector<GemmParams> groups;
  for (const MoeMlp::Segment& s : segs) {
    if (s.rows == 0) continue;
    const char* we = static_cast<const char*>(stacked.data()) + s.expert * rw * cw * es;
    groups.push_back(GemmParams{.trans_b = trans_b, .m = s.rows, .n = trans_b ? rw : cw, .k = trans_b ? cw : rw,
                                .beta = beta, .a = static_cast<const char*>(a) + s.first * lda * dtype_size(a_t),
                                .lda = lda, .a_dtype = a_t, .b = we, .ldb = cw, .b_dtype = stacked.dtype(),
                                .c = static_cast<char*>(c) + s.first * ldc * dtype_size(c_t), .ldc = ldc,
                                .c_dtype = c_t});
  }
  gemm_grouped(dev, groups);
}

// Each segment's weight gradient: dW_e (stacked fp32 (X', P, Q)) += g^T x over the segment's
// rows, g (M, P) and x (M, Q). Segments of one expert (from several ranks) add into its dW one
// after another, so they go in separate grouped calls (a grouped call's C must not overlap).
void per_expert_weight_grads(Device& dev, const std::vector<MoeMlp::Segment>& segs, const void* g, int64_t P,
                             const void* x, int64_t Q, DType t, const Tensor& dw) {
  std::vector<std::vector<GemmParams>> rounds;  // round r: each expert's r-th segment
  std::vector<size_t> seen;
  for (const MoeMlp::Segment& s : segs) {
    if (s.rows == 0) continue;
    if (seen.size() <= static_cast<size_t>(s.expert)) seen.resize(static_cast<size_t>(s.expert) + 1, 0);
    const size_t r = seen[static_cast<size_t>(s.expert)]++;
    if (rounds.size() <= r) rounds.resize(r + 1);
    rounds[r].push_back(GemmParams{.trans_a = true, .m = P, .n = Q, .k = s.rows, .beta = 1.0f,
                                   .a = static_cast<const char*>(g) + s.first * P * dtype_size(t), .lda = P,
                                   .a_dtype = t, .b = static_cast<const char*>(x) + s.first * Q * dtype_size(t),
                                   .ldb = Q, .b_dtype = t,
                                   .c = dw.as<float>() == nullptr ? nullptr : dw.as<float>() + s.expert * P * Q,
                                   .ldc = Q});
  }
  for (const std::vector<GemmParams>& r : rounds) gemm_grouped(dev, r);
}
}  // namespace

MoeMlp::ExpertInputs MoeMlp::expert_inputs(const Routing& R, const BlockWeights& w, const Tensor& b) {
  const int64_t n = b.dim(0), E = m_.hidden, k = m_.experts_per_token, m = n * k, Fe = m_.expert_ffn, M = R.received;
  Allocator& alloc = dev_.allocator();
  ExpertInputs in;
  in.xs = TensorBuffer(alloc, t_, {m, E}, Tag::kOther, "moe input rows in expert order (tile)");
  gather_rows(dev_, MoeRows{.n = n, .k = k, .m = m, .dim = E, .dtype = t_}, in.xs.data(), b.data(), n,
              R.idx.as<int32_t>());
  if (ep_ != nullptr) in.xs = exchange_rows(R, in.xs.data(), E, t_, true, "moe input rows at their experts (tile)");
  // gate, up (M, Fe) = x w_gate_e^T, x w_up_e^T over each expert's rows
  in.gate = TensorBuffer(alloc, t_, {M, Fe}, Tag::kOther, "moe gate (tile)");
  in.up = TensorBuffer(alloc, t_, {M, Fe}, Tag::kOther, "moe up (tile)");
  per_expert(dev_, R.segments, true, in.xs.data(), E, t_, w.e_gate, in.gate.data(), Fe, t_);
  per_expert(dev_, R.segments, true, in.xs.data(), E, t_, w.e_up, in.up.data(), Fe, t_);
  return in;
}

void MoeMlp::forward(const BlockWeights& w, const Tensor& b, const Tensor& out, int32_t* ids, bool use_ids,
                     MoeLayerStats* stats, const uint8_t* real) {
  const int64_t n = b.dim(0), E = m_.hidden, X = m_.experts, k = m_.experts_per_token, m = n * k, Fe = m_.expert_ffn;
  Allocator& alloc = dev_.allocator();
  Routing R = route(w, b, ids, use_ids);
  if (stats != nullptr && dev_.backed())
    for (int64_t r = 0; r < n; ++r) {
      if (real != nullptr && !real[r]) continue;
      stats->rows += 1;
      for (int64_t j = 0; j < k; ++j) stats->picks[static_cast<size_t>(ids[r * k + j])] += 1;
      for (int64_t e = 0; e < X; ++e) stats->prob_sum[static_cast<size_t>(e)] += R.probs[static_cast<size_t>(r * X + e)];
    }
  const MoeRows rows{.n = n, .k = k, .m = m, .dim = E, .dtype = t_};
  const int64_t M = R.received;
  // s = silu(gate) * up (over gate)
  ExpertInputs in = expert_inputs(R, w, b);
  TensorBuffer &gate = in.gate, &up = in.up;
  in.xs.reset();
  swiglu_forward(dev_, SwigluShape{.rows = M, .dim = Fe, .dtype = t_}, gate.data(), gate.data(), up.data());
  up.reset();
  // ys (M, E) = s w_down_e^T, back to the tokens' ranks;  out += combine(ys, w)
  TensorBuffer ys(alloc, t_, {M, E}, Tag::kOther, "moe expert outputs (tile)");
  per_expert(dev_, R.segments, true, gate.data(), Fe, t_, w.e_down, ys.data(), E, t_);
  gate.reset();
  if (ep_ != nullptr) ys = exchange_rows(R, ys.data(), E, t_, false, "moe expert outputs returned (tile)");
  combine_rows(dev_, rows, out.data(), ys.data(), R.pos.as<int32_t>(), R.w.as<float>(), /*accumulate=*/true);
}

void MoeMlp::backward(const BlockWeights& w, const BlockWeights& g, const Tensor& b, const Tensor& dy, const Tensor& db,
                      const int32_t* ids, const std::vector<float>& aux_grad, const uint8_t* real) {
  const int64_t n = b.dim(0), E = m_.hidden, X = m_.experts, k = m_.experts_per_token, m = n * k, Fe = m_.expert_ffn;
  Allocator& alloc = dev_.allocator();
  Routing R = route(w, b, const_cast<int32_t*>(ids), /*use_ids=*/true);
  const MoeRows rows{.n = n, .k = k, .m = m, .dim = E, .dtype = t_};
  // The forward again, at the experts: x, gate, up, s and ys (returned to the tokens' ranks).
  const int64_t M = R.received;
  ExpertInputs in = expert_inputs(R, w, b);
  TensorBuffer &xs = in.xs, &gate = in.gate, &up = in.up;
  TensorBuffer s(alloc, t_, {M, Fe}, Tag::kOther, "moe swiglu (tile)");
  swiglu_forward(dev_, SwigluShape{.rows = M, .dim = Fe, .dtype = t_}, s.data(), gate.data(), up.data());
  TensorBuffer ys(alloc, t_, {M, E}, Tag::kOther, "moe expert outputs (tile)");
  per_expert(dev_, R.segments, true, s.data(), Fe, t_, w.e_down, ys.data(), E, t_);
  if (ep_ != nullptr) ys = exchange_rows(R, ys.data(), E, t_, false, "moe expert outputs returned (tile)");
  // At the tokens' ranks: dys (m, E) = w dy of its token;  dw (n, k) = dy . ys;  dys to the experts
  TensorBuffer dys(alloc, t_, {m, E}, Tag::kOther, "moe d expert outputs (tile)");
  TensorBuffer dw(alloc, DType::kF32, {n, k}, Tag::kOther, "moe d routing weights (tile)");
  combine_rows_backward(dev_, rows, dys.data(), dw.as<float>(), dy.data(), ys.data(), R.pos.as<int32_t>(),
                        R.w.as<float>());
  ys.reset();
  if (ep_ != nullptr) dys = exchange_rows(R, dys.data(), E, t_, true, "moe d expert outputs at their experts (tile)");
  // dw_down_e += dys^T s;  ds (M, Fe) = dys w_down_e
  per_expert_weight_grads(dev_, R.segments, dys.data(), E, s.data(), Fe, t_, g.e_down);
  s.reset();
  TensorBuffer ds(alloc, t_, {M, Fe}, Tag::kOther, "moe dswiglu (tile)");
  per_expert(dev_, R.segments, false, dys.data(), E, t_, w.e_down, ds.data(), Fe, t_);
  dys.reset();
  // dgate, dup over gate, up
  swiglu_backward(dev_, SwigluShape{.rows = M, .dim = Fe, .dtype = t_}, gate.data(), up.data(), gate.data(), up.data(),
                  ds.data());
  ds.reset();
  // dw_gate_e += dgate^T x, dw_up_e likewise;  dx (M, E) fp32 = dgate w_gate_e + dup w_up_e, back
  per_expert_weight_grads(dev_, R.segments, gate.data(), Fe, xs.data(), E, t_, g.e_gate);
  per_expert_weight_grads(dev_, R.segments, up.data(), Fe, xs.data(), E, t_, g.e_up);
  xs.reset();
  TensorBuffer dxs(alloc, DType::kF32, {M, E}, Tag::kOther, "moe d input rows in expert order (tile)");
  per_expert(dev_, R.segments, false, gate.data(), Fe, t_, w.e_gate, dxs.data(), E, DType::kF32);
  per_expert(dev_, R.segments, false, up.data(), Fe, t_, w.e_up, dxs.data(), E, DType::kF32, 1.0f);
  gate.reset();
  up.reset();
  if (ep_ != nullptr)
    dxs = exchange_rows(R, dxs.data(), E, DType::kF32, false, "moe d input rows returned (tile)");
  // db (n, E) = the sum over the token's k rows of dx (weights 1), then the router's part.
  TensorBuffer dbf(alloc, DType::kF32, {n, E}, Tag::kOther, "moe d normed input, fp32 (tile)");
  combine_rows(dev_, MoeRows{.n = n, .k = k, .m = m, .dim = E, .dtype = DType::kF32}, dbf.data(), dxs.data(),
               R.pos.as<int32_t>(), nullptr, /*accumulate=*/false);
  dxs.reset();
  // The router: dlogits (n, X) on the host, then db += dlogits router, d router += dlogits^T b.
  std::vector<float> dw_host(static_cast<size_t>(n * k)), dlogits_host(static_cast<size_t>(n * X));
  if (dev_.backed()) {
    dev_.copy(dw_host.data(), dw.data(), dw.view().bytes());
    route_rows_backward(R.probs.data(), ids, dw_host.data(), n, X, k, m_.norm_topk_prob,
                        aux_grad.empty() ? nullptr : aux_grad.data(), real, dlogits_host.data());
  }
  dw.reset();
  // (in the block's dtype, as the GEMMs' other operands: cuBLAS multiplies like types)
  TensorBuffer dlogits(alloc, DType::kF32, {n, X}, Tag::kOther, "moe d router logits (tile)");
  dev_.copy(dlogits.data(), dlogits_host.data(), dlogits.view().bytes());
  if (t_ != DType::kF32) {
    TensorBuffer narrow(alloc, t_, {n, X}, Tag::kOther, "moe d router logits (tile)");
    convert(dev_, narrow.data(), t_, dlogits.data(), DType::kF32, n * X);
    dlogits = std::move(narrow);
  }
  gemm(dev_, GemmParams{.m = n, .n = E, .k = X, .beta = 1.0f, .a = dlogits.data(), .lda = X, .a_dtype = t_,
                        .b = w.router.data(), .ldb = E, .b_dtype = w.router.dtype(), .c = dbf.data(), .ldc = E});
  gemm(dev_, GemmParams{.trans_a = true, .m = X, .n = E, .k = n, .beta = 1.0f, .a = dlogits.data(), .lda = X,
                        .a_dtype = t_, .b = b.data(), .ldb = E, .b_dtype = t_, .c = g.router.data(), .ldc = E});
  convert(dev_, db.data(), db.dtype(), dbf.data(), DType::kF32, n * E);
}

}  // namespace untied

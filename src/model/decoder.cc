// The decoder's step: see decoder.h. Straight-line forward and backward per block.
#include "untied/model/decoder.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <cmath>
#include <type_traits>
#include <vector>

#include "untied/comm/watchdog.h"
#include "untied/kernels/adamw.h"
#include "untied/kernels/embedding.h"
#include "untied/kernels/gemm.h"
#include "untied/kernels/lm_head_loss.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/kernels/swiglu.h"
#include "untied/kernels/tensor_ops.h"

namespace untied {
namespace {

// dst (n) += src (n), each in its own storage type: the device's add_into.
void add_inplace(Device& dev, const Tensor& dst, const Tensor& src) {
  UNTIED_ASSERT(dst.numel() == src.numel(), "add_inplace: mismatched tensors");
  add_into(dev, dst.data(), dst.dtype(), src.data(), src.dtype(), dst.numel());
}


// The block's attention weights (with Qwen3's q/k norms and Qwen2's biases when the model has
// them: else empty).
AttentionWeights attention_weights(const BlockWeights& w) {
  return AttentionWeights{.wq = w.wq, .wk = w.wk, .wv = w.wv, .wo = w.wo, .q_norm = w.q_norm, .k_norm = w.k_norm,
                          .bq = w.bq, .bk = w.bk, .bv = w.bv};
}

// The one (L, E) buffer of the backward's residual stream: made as the last block's output, it
// holds dh from the loss on, each block's d residual after attention and its dx in turn.
constexpr const char* kDhName = "last block output, then dh";

// Rows [r0, r0 + n) of a contiguous (rows, cols) tensor.
Tensor rows_of(const Tensor& t, int64_t r0, int64_t n) { return t.slice0(r0, r0 + n); }

// The run's shapes, once validate() has passed (a Decoder is built from checked options only).
RunGeometry checked_geometry(const ModelConfig& m, const DecoderOptions& o, int ranks, bool offload) {
  Status s = validate(m, o, ranks);
  UNTIED_CHECK(s.ok(), s.message());
  return run_geometry(m, o, ranks, offload);
}

}  // namespace

struct Decoder::BlockActs {
  TensorBuffer a, rstd1, hm;  // attn_norm(x), its rstd, x + attn (the MLP's norm is per tile)
  AttentionSaved saved;
};

Decoder::Decoder(Device& dev, Communicator& comm, const ModelConfig& m, const DecoderOptions& o, Allocator* host)
    : dev_(dev), comm_(comm), m_(m), o_(o),
      g_(checked_geometry(m, o, comm.size(), host != nullptr)), host_(host) {
  attn_ = make_attention_block(dev, comm, g_.attention);
  if (m_.experts > 0) {
    moe_ = std::make_unique<MoeMlp>(dev, m_, o_.dtype, experts_parallel(m_, o_, comm.size()) ? &comm : nullptr,
                                    o_.moe_skew);
    real_.resize(static_cast<size_t>(g_.L));
    for (int64_t r = 0; r < g_.L; ++r) real_[static_cast<size_t>(r)] = g_.layout.position(comm.rank(), r) < g_.S;
  }
}

void Decoder::finish_moe_forward(StepSums& sums, double aux_weight) {
  const int64_t X = m_.experts;
  std::vector<double> all;  // per MoE layer: picks (X), probability sums (X), rows
  std::vector<MoeLayerStats> moe_layers;
  for (int64_t l = 0; l < m_.layers; ++l) {
    if (!moe_layer(m_, l)) continue;
    const MoeLayerStats& s = stats_[static_cast<size_t>(l)];
    all.insert(all.end(), s.picks.begin(), s.picks.end());
    all.insert(all.end(), s.prob_sum.begin(), s.prob_sum.end());
    all.push_back(s.rows);
  }
  comm_.all_reduce(all.data(), all.data(), static_cast<int64_t>(all.size()), DType::kF64, ReduceOp::kSum);
  for (size_t at = 0; at < all.size(); at += static_cast<size_t>(2 * X + 1)) {
    MoeLayerStats s;
    s.picks.assign(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + X));
    s.prob_sum.assign(all.begin() + static_cast<std::ptrdiff_t>(at + X),
                      all.begin() + static_cast<std::ptrdiff_t>(at + 2 * X));
    s.rows = all[at + static_cast<size_t>(2 * X)];
    sums.expert_load.insert(sums.expert_load.end(), s.picks.begin(), s.picks.end());
    moe_layers.push_back(std::move(s));
  }
  const double aux = load_balancing_loss(moe_layers, X, aux_weight * m_.router_aux_coef, &aux_grad_);
  sums.router_aux = aux_weight * m_.router_aux_coef * aux;
}

RmsNormShape Decoder::norm_shape(int64_t rows) const {
  return RmsNormShape{.rows = rows, .dim = m_.hidden, .eps = m_.norm_eps, .dtype = o_.dtype, .weight_dtype = o_.dtype};
}

// What forward and backward both compute for an MLP tile of n rows of hm: the normed input,
// its rstd, and the gate and up projections.
struct Decoder::MlpTile {
  TensorBuffer b, rstd, gate, up;
};

Decoder::MlpTile Decoder::mlp_norm_tile(const BlockWeights& w, const Tensor& hm_tile) {
  const int64_t n = hm_tile.dim(0);
  Allocator& alloc = dev_.allocator();
  MlpTile m;
  // b_t = mlp_norm(hm_t): the norm runs tile by tile too, so no (L, E) normed copy exists.
  m.b = TensorBuffer(alloc, o_.dtype, {n, m_.hidden}, Tag::kOther, "mlp_norm output (tile)");
  m.rstd = TensorBuffer(alloc, DType::kF32, {n}, Tag::kOther, "mlp_norm rstd (tile)");
  rmsnorm_forward(dev_, norm_shape(n), m.b.data(), m.rstd.as<float>(), hm_tile.data(), w.mlp_norm.data());
  return m;
}

Decoder::MlpTile Decoder::mlp_tile_inputs(const BlockWeights& w, const Tensor& hm_tile) {
  const int64_t n = hm_tile.dim(0), E = m_.hidden, F = m_.ffn;
  const DType t = o_.dtype;
  Allocator& alloc = dev_.allocator();
  MlpTile m = mlp_norm_tile(w, hm_tile);
  m.gate = TensorBuffer(alloc, t, {n, F}, Tag::kOther, "mlp gate (tile)");
  m.up = TensorBuffer(alloc, t, {n, F}, Tag::kOther, "mlp up (tile)");
  // gate, up (n, F) = b_t w_gate^T, b_t w_up^T
  for (auto [dst, wt] : {std::pair{&m.gate, &w.w_gate}, {&m.up, &w.w_up}})
    gemm(dev_, GemmParams{.trans_b = true, .m = n, .n = F, .k = E, .a = m.b.data(), .lda = E, .a_dtype = t,
                          .b = wt->data(), .ldb = E, .b_dtype = t, .c = dst->data(), .ldc = F, .c_dtype = t});
  return m;
}

void Decoder::mlp_forward(int layer, const BlockWeights& w, const Tensor& hm, const Tensor& out_add) {
  const int64_t E = m_.hidden, F = m_.ffn;
  const DType t = o_.dtype;
  if (w.moe()) {
    const int64_t k = m_.experts_per_token;  // (see mlp_backward for the tiles' buffers)
    std::vector<int32_t> ids;  // a forward that keeps no routing: one tile's
    for (int64_t r0 = 0; r0 < g_.L; r0 += g_.mlp_tile) {
      const int64_t n = std::min(g_.mlp_tile, g_.L - r0);
      const MlpTile normed = mlp_norm_tile(w, rows_of(hm, r0, n));
      int32_t* tile_ids = nullptr;
      if (recording_) {
        tile_ids = routes_[static_cast<size_t>(layer)].data() + r0 * k;
      } else {
        ids.resize(static_cast<size_t>(n * k));
        tile_ids = ids.data();
      }
      moe_->forward(w, normed.b, rows_of(out_add, r0, n), tile_ids, false, recording_ ? &stats_[static_cast<size_t>(layer)] : nullptr,
                    real_.data() + r0);
    }
    return;
  }
  for (int64_t r0 = 0; r0 < g_.L; r0 += g_.mlp_tile) {
    const int64_t n = std::min(g_.mlp_tile, g_.L - r0);
    const Tensor ot = rows_of(out_add, r0, n);
    MlpTile m = mlp_tile_inputs(w, rows_of(hm, r0, n));
    m.b.reset();
    TensorBuffer& gate = m.gate;
    swiglu_forward(dev_, SwigluShape{.rows = n, .dim = F, .dtype = t}, gate.data(), gate.data(), m.up.data());
    // out_t (n, E) += s w_down^T   (s written over gate: swiglu reads each element before writing)
    gemm(dev_, GemmParams{.trans_b = true, .m = n, .n = E, .k = F, .beta = 1.0f, .a = gate.data(), .lda = F,
                          .a_dtype = t, .b = w.w_down.data(), .ldb = F, .b_dtype = t, .c = ot.data(), .ldc = E,
                          .c_dtype = t});
  }
}

void Decoder::mlp_backward(int layer, const BlockWeights& w, const BlockWeights& g, const Tensor& hm, const Tensor& dy) {
  const int64_t E = m_.hidden, F = m_.ffn;
  const DType t = o_.dtype;
  Allocator& alloc = dev_.allocator();
  if (w.moe()) {  // per tile: b = mlp_norm(hm), db = moe'(dy), dy += mlp_norm'(db)
    for (int64_t r0 = 0; r0 < g_.L; r0 += g_.mlp_tile) {
      const int64_t n = std::min(g_.mlp_tile, g_.L - r0);
      const Tensor hmt = rows_of(hm, r0, n), dyt = rows_of(dy, r0, n);
      MlpTile m = mlp_norm_tile(w, hmt);
      TensorBuffer db(alloc, t, {n, E}, Tag::kOther, "d mlp_norm output (tile)");
      moe_->backward(w, g, m.b, dyt, db, routes_[static_cast<size_t>(layer)].data() + r0 * m_.experts_per_token,
                     aux_grad_, real_.data() + r0);
      // dy_t += mlp_norm'(db_t), written over b_t as the dense tiles do
      rmsnorm_backward(dev_, norm_shape(n), m.b.data(), g.mlp_norm.as<float>(), hmt.data(), m.rstd.as<float>(),
                       w.mlp_norm.data(), db.data());
      add_inplace(dev_, dyt, m.b);
    }
    return;
  }
  for (int64_t r0 = 0; r0 < g_.L; r0 += g_.mlp_tile) {
    const int64_t n = std::min(g_.mlp_tile, g_.L - r0);
    const Tensor hmt = rows_of(hm, r0, n), dyt = rows_of(dy, r0, n);
    MlpTile m = mlp_tile_inputs(w, hmt);
    TensorBuffer& bt = m.b;
    TensorBuffer &gate = m.gate, &up = m.up;
    TensorBuffer dbt(alloc, t, {n, E}, Tag::kOther, "d mlp_norm output (tile)");
    TensorBuffer s(alloc, t, {n, F}, Tag::kOther, "mlp swiglu (tile)"), ds(alloc, t, {n, F}, Tag::kOther, "mlp dswiglu (tile)");
    swiglu_forward(dev_, SwigluShape{.rows = n, .dim = F, .dtype = t}, s.data(), gate.data(), up.data());
    // dw_down (E, F) += dy_t^T s;  ds (n, F) = dy_t w_down
    gemm(dev_, GemmParams{.trans_a = true, .m = E, .n = F, .k = n, .beta = 1.0f, .a = dyt.data(), .lda = E,
                          .a_dtype = t, .b = s.data(), .ldb = F, .b_dtype = t, .c = g.w_down.data(), .ldc = F});
    gemm(dev_, GemmParams{.m = n, .n = F, .k = E, .a = dyt.data(), .lda = E, .a_dtype = t, .b = w.w_down.data(),
                          .ldb = F, .b_dtype = t, .c = ds.data(), .ldc = F, .c_dtype = t});
    s.reset();
    // dgate, dup written over gate, up.
    swiglu_backward(dev_, SwigluShape{.rows = n, .dim = F, .dtype = t}, gate.data(), up.data(), gate.data(),
                    up.data(), ds.data());
    ds.reset();
    // dw_gate, dw_up (F, E) += d^T b_t;  db_t (n, E) = dgate w_gate + dup w_up
    float beta = 0.0f;
    for (auto [d, wt, dw] : {std::tuple{&gate, &w.w_gate, &g.w_gate}, {&up, &w.w_up, &g.w_up}}) {
      gemm(dev_, GemmParams{.trans_a = true, .m = F, .n = E, .k = n, .beta = 1.0f, .a = d->data(), .lda = F,
                            .a_dtype = t, .b = bt.data(), .ldb = E, .b_dtype = t, .c = dw->data(), .ldc = E});
      gemm(dev_, GemmParams{.m = n, .n = E, .k = F, .beta = beta, .a = d->data(), .lda = F, .a_dtype = t,
                            .b = wt->data(), .ldb = E, .b_dtype = t, .c = dbt.data(), .ldc = E, .c_dtype = t});
      beta = 1.0f;
    }
    // dy_t += mlp_norm'(db_t), the norm's gradient written over b_t (read for the last time above):
    // the same sum as dy_t + mlp_norm'(db_t) into a buffer of its own, with no (L, E) buffer more
    rmsnorm_backward(dev_, norm_shape(n), bt.data(), g.mlp_norm.as<float>(), hmt.data(), m.rstd.as<float>(),
                     w.mlp_norm.data(), dbt.data());
    add_inplace(dev_, dyt, bt);
  }
}

TiledInput Decoder::normed_tiles(const BlockWeights& w, const Tensor& x, bool x_on_host, float* rstd) {
  const int64_t E = m_.hidden, es = dtype_size(o_.dtype);
  auto staging = std::make_shared<TensorBuffer>();  // x_on_host: the tile fetched to the device
  if (x_on_host)
    *staging = TensorBuffer(dev_.allocator(), o_.dtype, {g_.attn_tile, E}, Tag::kOther, "block input (tile, fetched)");
  const Tensor weight = w.attn_norm;
  return TiledInput{.tile = g_.attn_tile, .rows = [this, x, x_on_host, rstd, weight, staging, E, es](
                                                    int64_t r0, int64_t n, void* dst) {
    const char* src = x.data() == nullptr ? nullptr : static_cast<const char*>(x.data()) + r0 * E * es;
    if (x_on_host) {
      dev_.copy(staging->data(), src, n * E * es);
      src = static_cast<const char*>(staging->data());
    }
    rmsnorm_forward(dev_, norm_shape(n), dst, rstd == nullptr ? nullptr : rstd + r0, src, weight.data());
  }};
}

TensorBuffer Decoder::block_forward(int layer, const BlockWeights& w, const Tensor& x, bool x_on_host, BlockActs* acts,
                                    const std::string& out_name, AttentionSaved* kept_attn) {
  const int64_t L = g_.L, E = m_.hidden;
  const DType t = o_.dtype;
  Allocator& alloc = dev_.allocator();
  const RmsNormShape norm = norm_shape(L);
  BlockActs local;
  BlockActs& A = acts != nullptr ? *acts : local;
  // a = attn_norm(x);  hm = x + attn(a)   (with g_.attn_tile, a and the attention's output only ever
  // a tile at a time, and hm made as the output's first tile comes: not live through the stages)
  A.rstd1 = TensorBuffer(alloc, DType::kF32, {L}, Tag::kOther, "attn_norm rstd");
  // Without acts (the forward pass) hm becomes the block's output in place (y = hm + mlp(...),
  // tile by tile): it is allocated as that, the next block's input.
  auto make_hm = [&] {
    A.hm = acts != nullptr ? TensorBuffer(alloc, t, {L, E}, Tag::kOther, "residual after attention")
                           : TensorBuffer(alloc, t, {L, E}, Tag::kActivations, out_name);
  };
  UNTIED_CHECK(!x_on_host || g_.attn_tile > 0, "decoder: a block input in host memory needs the attention's tiles");
  // The forward pass has no backward: it keeps nothing (but, with kept_attn, the attention's output).
  // A recompute from a kept output (acts->saved.output_kept) projects none of upipe's stages.
  A.saved.keep_last_stage = acts != nullptr && o_.keep_last_stage != KeepLastStage::kOff && !A.saved.output_kept;
  // With a kept output, upipe's recompute reads no row of x: rstd1 is written by the backward's
  // projections, which read every row before the attn_norm backward does.
  if (g_.attn_tile > 0) {
    bool made = false;
    TensorBuffer xt;  // x_on_host: the tile of x fetched to the device
    auto add_input = [&](int64_t r0, int64_t n, const void* y_rows) {
      if (!made) {
        make_hm();
        if (x_on_host) xt = TensorBuffer(alloc, t, {g_.attn_tile, E}, Tag::kOther, "block input (tile, fetched)");
        made = true;
      }
      const Tensor hm_rows = rows_of(A.hm, r0, n);
      dev_.copy(hm_rows.data(), y_rows, n * E * dtype_size(t));
      if (!x_on_host) {
        add_inplace(dev_, hm_rows, rows_of(x, r0, n));
      } else {  // x's rows copied from host memory
        dev_.copy(xt.data(), rows_of(x, r0, n).data(), n * E * dtype_size(t));
        add_inplace(dev_, hm_rows, rows_of(xt, 0, n));
      }
    };
    attn_->forward(TiledOutput{.tile = g_.attn_tile, .consume = add_input, .host = g_.host.attn_out ? host_ : nullptr},
                   normed_tiles(w, x, x_on_host, A.rstd1.as<float>()), attention_weights(w), *mask_, A.saved);
  } else {
    make_hm();
    A.a = TensorBuffer(alloc, t, {L, E}, Tag::kOther, "attn_norm output");
    rmsnorm_forward(dev_, norm, A.a.data(), A.rstd1.as<float>(), x.data(), w.attn_norm.data());
    attn_->forward(A.hm, A.a, attention_weights(w), *mask_, A.saved);
    add_inplace(dev_, A.hm, x);
  }
  if (acts != nullptr) return TensorBuffer();  // recompute for backward: the MLP is recomputed tile by tile there
  if (kept_attn != nullptr) {
    A.saved.keep_output_only();
    *kept_attn = std::move(A.saved);
  }
  A.saved.reset();
  // y = hm + mlp(mlp_norm(hm)), tile by tile, into hm itself (each tile's rows are read before
  // they are added to)
  mlp_forward(layer, w, A.hm, A.hm);
  return std::move(A.hm);
}

void Decoder::block_backward(int layer, const BlockWeights& w, const BlockWeights& g, const BlockInput& in, TensorBuffer& dh,
                             BlockActs& A) {
  const int64_t L = g_.L, E = m_.hidden;
  const DType t = o_.dtype;
  Allocator& alloc = dev_.allocator();
  // y = hm + mlp(mlp_norm(hm)):  dhm = dy + mlp_norm'(mlp'(dy)), tile by tile, in dy's buffer
  mlp_backward(layer, w, g, A.hm, dh);
  A.hm.reset();
  TensorBuffer dhm = std::move(dh);  // in: d residual after attention; out (dx): d block input
  // dh_on_host: dhm waits in host memory through the attention's backward, read a tile at a time
  // (its dO projections, dwo, D), and dx is made in a new device buffer as its first tile comes.
  const bool dh_host = g_.host.dh;
  TensorBuffer dhm_host;
  if (dh_host) {
    dhm_host = TensorBuffer(*host_, t, {L, E}, Tag::kOther, "d residual after attention (offloaded)");
    dev_.copy(dhm_host.data(), dhm.data(), dhm.view().bytes());
    dhm.reset();
  }
  // hm = x + attn(attn_norm(x)):  dx = dhm + attn_norm'(attn'(dhm))
  // The attention's weight gradients: g's fp32 buffers, or, for a bf16 block, buffers in the
  // compute dtype added into g's after (tmp).
  struct AttnGrad {
    const Tensor* full;  // fp32 (g)
    Tensor* out;         // what the attention block writes
    const char* what;
  };
  AttentionGrads ag;
  std::vector<AttnGrad> attn_grads = {{&g.wq, &ag.dwq, "dwq (compute dtype)"},
                                      {&g.wk, &ag.dwk, "dwk (compute dtype)"},
                                      {&g.wv, &ag.dwv, "dwv (compute dtype)"},
                                      {&g.wo, &ag.dwo, "dwo (compute dtype)"}};
  if (m_.qk_norm)
    attn_grads.insert(attn_grads.end(), {{&g.q_norm, &ag.dq_norm, "dq_norm (compute dtype)"},
                                         {&g.k_norm, &ag.dk_norm, "dk_norm (compute dtype)"}});
  if (m_.qkv_bias)
    attn_grads.insert(attn_grads.end(), {{&g.bq, &ag.dbq, "dbq (compute dtype)"},
                                         {&g.bk, &ag.dbk, "dbk (compute dtype)"},
                                         {&g.bv, &ag.dbv, "dbv (compute dtype)"}});
  std::vector<TensorBuffer> tmp;
  tmp.reserve(attn_grads.size());
  for (const AttnGrad& a : attn_grads) {
    if (t == DType::kF32) {
      *a.out = *a.full;
    } else {
      tmp.emplace_back(alloc, t, a.full->shape(), Tag::kGradients, a.what);
      *a.out = tmp.back();
    }
  }
  // dx = dhm + attn_norm'(da) a tile of rows at a time (da narrowed to the block dtype per tile),
  // into dhm's own rows: the block's input gradient takes dhm's buffer. x's rows come from the
  // device, or (an input only in host memory) are copied from there a tile at a time.
  // (Made at the first tile: not live through the attention's stages.)
  TensorBuffer dxt, xt;
  bool tiles_made = false;
  auto norm_backward = [&](int64_t r0, int64_t n, const float* da_rows) {
    if (!tiles_made) {
      if (dh_host) dhm = TensorBuffer(alloc, t, {L, E}, Tag::kActivations, kDhName);
      dxt = TensorBuffer(alloc, t, {std::min(g_.mlp_tile, L), E}, Tag::kOther, "d block input (tile)");
      if (in.on_host) xt = TensorBuffer(alloc, t, {std::min(g_.mlp_tile, L), E}, Tag::kOther, "block input (tile, fetched)");
      tiles_made = true;
    }
    TensorBuffer dat_t;
    if (t != DType::kF32) {
      dat_t = TensorBuffer(alloc, t, {n, E}, Tag::kOther, "d attn_norm output (tile)");
      convert(dev_, dat_t.data(), t, da_rows, DType::kF32, n * E);
    }
    const void* x_rows = rows_of(in.x, r0, n).data();
    if (in.on_host) {
      dev_.copy(xt.data(), x_rows, n * E * dtype_size(t));
      x_rows = xt.data();
    }
    const Tensor dx_n = rows_of(dxt, 0, n), dhm_n = rows_of(dhm, r0, n);
    if (dh_host) dev_.copy(dhm_n.data(), rows_of(dhm_host, r0, n).data(), n * E * dtype_size(t));
    rmsnorm_backward(dev_, norm_shape(n), dx_n.data(), g.attn_norm.as<float>(), x_rows, A.rstd1.as<float>() + r0,
                     w.attn_norm.data(), t != DType::kF32 ? dat_t.data() : da_rows);
    add_inplace(dev_, dhm_n, dx_n);  // dhm + norm'(da): the same sum, in the same order, as dx_n += dhm_n
  };
  // The attention's backward into da (a TiledGrad or a whole tensor), its input by tiles or whole.
  auto attention_backward = [&](const auto& da) {
    if constexpr (std::is_same_v<std::decay_t<decltype(da)>, TiledGrad>) {
      if (dh_host) {  // dy's rows copied from the host copy
        const Tensor src = dhm_host.view();
        const TiledInput dy{.tile = g_.attn_tile, .rows = [this, src, E](int64_t r0, int64_t n, void* dst) {
          dev_.copy(dst, rows_of(src, r0, n).data(), n * E * dtype_size(o_.dtype));
        }};
        attn_->backward(da, ag, dy, normed_tiles(w, in.x, in.on_host, A.rstd1.as<float>()), attention_weights(w),
                        A.saved);
        return;
      }
    }
    if (g_.attn_tile > 0)
      attn_->backward(da, ag, dhm, normed_tiles(w, in.x, in.on_host, A.rstd1.as<float>()), attention_weights(w),
                      A.saved);
    else
      attn_->backward(da, ag, dhm, A.a, attention_weights(w), A.saved);
  };
  if (o_.tiled_dx) {
    attention_backward(TiledGrad{.tile = g_.mlp_tile, .consume = norm_backward, .host = g_.host.grads ? host_ : nullptr});
  } else {
    // da (the attention's dx) whole in fp32: the attention block accumulates straight into it.
    TensorBuffer da(alloc, DType::kF32, {L, E}, Tag::kOther, "d attn_norm output (fp32)");
    attention_backward(da.view());
    A.a.reset();
    for (int64_t r0 = 0; r0 < L; r0 += g_.mlp_tile) {
      const int64_t n = std::min(g_.mlp_tile, L - r0);
      norm_backward(r0, n, rows_of(da, r0, n).as<float>());
    }
  }
  if (t != DType::kF32)
    for (size_t k = 0; k < attn_grads.size(); ++k) add_inplace(dev_, *attn_grads[k].full, tmp[k]);
  tmp.clear();
  A.a.reset();
  dhm_host.reset();
  dh = std::move(dhm);
}

void Decoder::use_mask(const SequenceMask& mask) {
  UNTIED_CHECK(mask.seq() == padded_seq(), "decoder: the sequence mask covers ", mask.seq(), " tokens, not the ",
               padded_seq(), " the decoder runs");
  mask_ = &mask;
}

TensorBuffer Decoder::forward_only(ParameterStore& params, const int32_t* tokens,
                                   const std::function<bool(int64_t, const Tensor&)>& after_stage) {
  const int64_t L = g_.L, E = m_.hidden;
  const DType t = o_.dtype;
  Allocator& alloc = dev_.allocator();
  TensorBuffer h(alloc, t, {L, E}, Tag::kActivations, "block 0 input");
  {
    TensorBuffer ids(alloc, DType::kI32, {L}, Tag::kOther, "token ids");
    dev_.copy(ids.data(), tokens, ids.view().bytes());
    const ParamGroup w = params.gather(0);
    embedding_forward(dev_, EmbeddingShape{.tokens = L, .vocab = m_.vocab, .dim = E, .dtype = t, .table_dtype = t},
                      h.data(), ids.as<int32_t>(), bind_embedding(w).embed.data());
  }
  if (after_stage && !after_stage(0, h)) return h;
  for (int l = 0; l < m_.layers; ++l) {  // nothing is kept: each block's input is freed once it has run
    const ParamGroup w = params.gather(l + 1);
    h = block_forward(l, bind_block(m_, w), h, /*x_on_host=*/false, nullptr, "block " + std::to_string(l + 1) + " input");
    if (after_stage && !after_stage(l + 1, h)) break;
  }
  return h;
}

TensorBuffer Decoder::final_norm_forward(const Tensor& h, const Tensor& weight) {
  const int64_t L = g_.L;
  TensorBuffer hn(dev_.allocator(), o_.dtype, {L, m_.hidden}, Tag::kOther, "final_norm output");
  TensorBuffer rstd(dev_.allocator(), DType::kF32, {L}, Tag::kOther, "final_norm rstd");
  rmsnorm_forward(dev_, norm_shape(L), hn.data(), rstd.as<float>(), h.data(), weight.data());
  return hn;
}

StepSums Decoder::forward_backward(ParameterStore& params, const int32_t* tokens, const int32_t* labels,
                                   const uint8_t* is_answer, int64_t global_count) {
  const SequenceMask plain = SequenceMask(o_.seq).padded_to(padded_seq());
  return forward_backward(params, tokens, labels, is_answer, global_count, plain);
}

StepSums Decoder::forward_backward(ParameterStore& params, const int32_t* tokens, const int32_t* labels,
                                   const uint8_t* is_answer, int64_t global_count, const SequenceMask& mask,
                                   double aux_weight) {
  use_mask(mask);
  const int64_t L = g_.L, E = m_.hidden, V = m_.vocab;
  const int N = static_cast<int>(m_.layers);
  const DType t = o_.dtype;
  Allocator& alloc = dev_.allocator();
  const EmbeddingShape emb{.tokens = L, .vocab = V, .dim = E, .dtype = t, .table_dtype = t};

  // Forward: keep only each block's input.
  alloc.set_phase(Phase::kForward);
  // The ids on the device, for the embedding's forward and backward.
  TensorBuffer ids(alloc, DType::kI32, {L}, Tag::kOther, "token ids");
  dev_.copy(ids.data(), tokens, ids.view().bytes());
  TensorBuffer h(alloc, t, {L, E}, Tag::kActivations, "block 0 input");
  {
    const ParamGroup w = params.gather(0);
    embedding_forward(dev_, emb, h.data(), ids.as<int32_t>(), bind_embedding(w).embed.data());
  }
  std::vector<TensorBuffer> inputs;  // each block's input: on the device, or offloaded to host_ (offloads(l))
  // Recompute::kSelective: each block's attention output, LSE and mask, for its recompute.
  const bool selective = o_.recompute == Recompute::kSelective;
  std::vector<AttentionSaved> kept_attn(selective ? static_cast<size_t>(N) : 0);
  if (moe_ != nullptr) {  // the MoE layers record their routing and statistics for the backward
    routes_.assign(static_cast<size_t>(N), {});
    stats_.assign(static_cast<size_t>(N), MoeLayerStats{});
    for (int l = 0; l < N; ++l)
      if (moe_layer(m_, l)) {
        routes_[static_cast<size_t>(l)].assign(static_cast<size_t>(L * m_.experts_per_token), 0);
        stats_[static_cast<size_t>(l)].picks.assign(static_cast<size_t>(m_.experts), 0.0);
        stats_[static_cast<size_t>(l)].prob_sum.assign(static_cast<size_t>(m_.experts), 0.0);
      }
    recording_ = true;
    moe_->take_sent_bytes();  // (an evaluation's are not the step's)
  }
  for (int l = 0; l < N; ++l) {
    watchdog_note(1, "forward, block " + std::to_string(l));
    const ParamGroup w = params.gather(l + 1);
    // The last block's output becomes the residual stream's gradient in the loss (kDhName).
    TensorBuffer y = block_forward(l, bind_block(m_, w), h, /*x_on_host=*/false, nullptr,
                                   l + 1 < N ? "block " + std::to_string(l + 1) + " input" : kDhName,
                                   selective ? &kept_attn[static_cast<size_t>(l)] : nullptr);
    if (offloads(l)) {
      TensorBuffer c(*host_, t, {L, E}, Tag::kActivations, "block " + std::to_string(l) + " input (offloaded)");
      dev_.copy(c.data(), h.data(), h.view().bytes());
      inputs.push_back(std::move(c));
    } else {
      inputs.push_back(std::move(h));
    }
    h = std::move(y);
  }

  // Loss, fused with its backward, a chunk of rows at a time (the kernel's own chunk, so that its
  // arithmetic is the same): final_norm(h), the loss and the norm's backward per chunk, dh written
  // over h's rows. No (L, E) buffer but h itself.
  recording_ = false;
  StepSums sums;
  if (moe_ != nullptr) finish_moe_forward(sums, aux_weight);
  watchdog_note(1, "loss");
  alloc.set_phase(Phase::kBackward);
  {
    const ParamGroup wg = params.gather(N + 1);
    ParamGroup gg = params.grad_buffers(N + 1);
    const HeadWeights w = bind_head(m_, wg), g = bind_head(m_, gg);
    // Tied embeddings: the head is the embedding table, gathered once more, and the head's
    // gradient goes to the embedding's (reduced here; the embedding backward adds its own later).
    ParamGroup we, ge;
    if (m_.tied_embeddings) {
      we = params.gather(0);
      ge = params.grad_buffers(0);
    }
    const Tensor head = m_.tied_embeddings ? bind_embedding(we).embed : w.lm_head;
    float* const dhead = m_.tied_embeddings ? bind_embedding(ge).embed.as<float>() : g.lm_head.as<float>();
    LmHeadLossShape ce{.tokens = L, .dim = E, .vocab = V, .chunk_tokens = o_.loss_chunk,
                       .grad_scale = global_count > 0 ? 1.0f / static_cast<float>(global_count) : 0.0f,
                       .dtype = t, .weight_dtype = t};
    const int64_t chunk = std::max<int64_t>(lm_head_loss_chunk(ce), 1);
    TensorBuffer argmax(alloc, DType::kI32, {L}, Tag::kOther, "predictions");
    TensorBuffer targets(alloc, DType::kI32, {L}, Tag::kOther, "labels");
    dev_.copy(targets.data(), labels, targets.view().bytes());
    TensorBuffer hn(alloc, t, {chunk, E}, Tag::kOther, "final_norm output, then dh (chunk)");
    TensorBuffer rstd(alloc, DType::kF32, {chunk}, Tag::kOther, "final_norm rstd (chunk)");
    TensorBuffer dhn(alloc, t, {chunk, E}, Tag::kOther, "d final_norm output (chunk)");
    LossSums ls;
    for (int64_t r0 = 0; r0 < L; r0 += chunk) {
      const int64_t n = std::min(chunk, L - r0);
      const Tensor hc = rows_of(h, r0, n);
      const RmsNormShape norm = norm_shape(n);
      ce.tokens = n;
      rmsnorm_forward(dev_, norm, hn.data(), rstd.as<float>(), hc.data(), w.final_norm.data());
      lm_head_loss_forward_backward(dev_, ce, &ls, argmax.as<int32_t>() + r0, dhn.data(), dhead, hn.data(),
                                    targets.as<int32_t>() + r0, head.data());
      // the chunk's dh over its final_norm output (read by the loss only), then over its rows of h
      rmsnorm_backward(dev_, norm, hn.data(), g.final_norm.as<float>(), hc.data(), rstd.as<float>(),
                       w.final_norm.data(), dhn.data());
      dev_.copy(hc.data(), hn.data(), n * E * dtype_size(t));
    }
    params.reduce_grads(gg);
    if (m_.tied_embeddings) params.reduce_grads(ge);
    sums.loss_sum = ls.loss_sum;
    sums.count = ls.count;
    if (dev_.backed() && is_answer != nullptr) {
      std::vector<int32_t> predicted(static_cast<size_t>(L));
      dev_.copy(predicted.data(), argmax.data(), argmax.view().bytes());
      for (int64_t i = 0; i < L; ++i)
        if (is_answer[i]) {
          sums.answers += 1;
          sums.correct += predicted[i] == labels[i];
        }
    }
  }
  TensorBuffer dh = std::move(h);  // the last block's output gradient, in its output's buffer

  // Backward, last block first: recompute the block from its input, then its backward.
  for (int l = N - 1; l >= 0; --l) {
    watchdog_note(1, "backward, block " + std::to_string(l));
    const ParamGroup wg = params.gather(l + 1);
    ParamGroup gg = params.grad_buffers(l + 1);
    const BlockWeights w = bind_block(m_, wg), g = bind_block(m_, gg);
    // An offloaded input is read from host memory a tile at a time by the recompute and the
    // backward (o_.refetch_inputs, with the attention's tiles); otherwise it is fetched to the
    // device for the recompute and, with refetch_inputs, dropped again for the backward.
    const bool from_host = offloads(l) && o_.refetch_inputs && g_.attn_tile > 0;
    TensorBuffer fetched;
    if (offloads(l) && !from_host) {
      fetched = TensorBuffer(alloc, t, {L, E}, Tag::kActivations, "block input (fetched)");
      dev_.copy(fetched.data(), inputs[l].data(), inputs[l].view().bytes());
    }
    const Tensor x = offloads(l) && !from_host ? fetched.view() : inputs[l].view();
    BlockActs acts;
    if (selective) acts.saved = std::move(kept_attn[static_cast<size_t>(l)]);
    block_forward(l, w, x, from_host, &acts);
    BlockInput in{.x = x, .on_host = from_host};
    if (offloads(l) && o_.refetch_inputs && !from_host) {
      in = BlockInput{.x = inputs[l].view(), .on_host = true};
      fetched.reset();
    }
    block_backward(l, w, g, in, dh, acts);  // dh: d output in, d input out
    params.reduce_grads(gg);
    inputs[l].reset();
  }
  {
    ParamGroup g = params.grad_buffers(0);
    embedding_backward(dev_, emb, bind_embedding(g).embed.as<float>(), ids.as<int32_t>(), dh.data());
    params.reduce_grads(g);
  }
  if (moe_ != nullptr) sums.moe_sent_bytes = moe_->take_sent_bytes();
  alloc.set_phase(Phase::kSetup);
  return sums;
}

EvalSums Decoder::evaluate(ParameterStore& params, const int32_t* tokens, const int32_t* labels,
                           const SequenceMask& mask, double* row_losses, float* logits) {
  use_mask(mask);
  const int64_t L = g_.L, E = m_.hidden, V = m_.vocab;
  const int N = static_cast<int>(m_.layers);
  const DType t = o_.dtype;
  Allocator& alloc = dev_.allocator();
  alloc.set_phase(Phase::kForward);
  EvalSums sums;
  const ParamGroup wg = params.gather(N + 1);
  const HeadWeights w = bind_head(m_, wg);
  const TensorBuffer hn = final_norm_forward(forward_only(params, tokens), w.final_norm);
  ParamGroup we;
  if (m_.tied_embeddings) we = params.gather(0);
  const Tensor head = m_.tied_embeddings ? bind_embedding(we).embed : w.lm_head;
  TensorBuffer argmax(alloc, DType::kI32, {L}, Tag::kOther, "predictions");
  TensorBuffer targets(alloc, DType::kI32, {L}, Tag::kOther, "labels");
  dev_.copy(targets.data(), labels, targets.view().bytes());
  LossSums ls;
  const LmHeadLossShape ce{.tokens = L, .dim = E, .vocab = V, .chunk_tokens = o_.loss_chunk, .dtype = t,
                           .weight_dtype = t};
  lm_head_loss_forward(dev_, ce, &ls, argmax.as<int32_t>(), hn.data(), targets.as<int32_t>(), head.data(),
                       row_losses);
  sums.loss_sum = ls.loss_sum;
  sums.count = ls.count;
  if (dev_.backed()) {
    std::vector<int32_t> predicted(static_cast<size_t>(L));
    dev_.copy(predicted.data(), argmax.data(), argmax.view().bytes());
    for (int64_t i = 0; i < L; ++i) sums.correct += labels[i] != ce.ignore_index && predicted[i] == labels[i];
  }
  if (logits != nullptr) {  // (L, V) fp32 = hn head^T, for comparisons with other implementations
    TensorBuffer out(alloc, DType::kF32, {L, V}, Tag::kOther, "logits");
    gemm(dev_, GemmParams{.trans_b = true, .m = L, .n = V, .k = E, .a = hn.data(), .lda = E, .a_dtype = t,
                          .b = head.data(), .ldb = E, .b_dtype = t, .c = out.data(), .ldc = V});
    if (dev_.backed()) dev_.copy(logits, out.data(), out.view().bytes());
  }
  alloc.set_phase(Phase::kSetup);
  return sums;
}

namespace {
// Whether every element of t (f32 or bf16, on the device) is finite: its sum of squares is.
bool all_finite(Device& dev, const Tensor& t) {
  if (t.dtype() == DType::kF32) return std::isfinite(grad_sum_squares(dev, t.as<float>(), t.numel()));
  TensorBuffer wide(dev.allocator(), DType::kF32, {t.numel()}, Tag::kOther, "finiteness check");
  convert(dev, wide.data(), DType::kF32, t.data(), t.dtype(), t.numel());
  return std::isfinite(grad_sum_squares(dev, wide.as<float>(), t.numel()));
}
}  // namespace

std::string Decoder::first_nonfinite_activation(ParameterStore& params, const int32_t* tokens,
                                                const SequenceMask& mask) {
  use_mask(mask);
  const int N = static_cast<int>(m_.layers);
  // The first stage whose output is not finite on some rank: 0 the embedding, 1 + l block l,
  // N + 1 the final norm; N + 2 when all are.
  auto first_over_ranks = [&](int64_t stage, bool finite) {
    int64_t bad = finite ? N + 2 : stage;
    comm_.all_reduce(&bad, &bad, 1, DType::kI64, ReduceOp::kMin);
    return bad;
  };
  auto name = [&](int64_t stage) -> std::string {
    if (stage == 0) return "the embedding output";
    if (stage <= N) return "the output of block " + std::to_string(stage - 1) + " (its attention or its MLP)";
    return "the final norm's output";
  };
  int64_t bad = N + 2;
  const TensorBuffer h = forward_only(params, tokens, [&](int64_t stage, const Tensor& out) {
    bad = first_over_ranks(stage, all_finite(dev_, out));
    return bad > N + 1;
  });
  if (bad <= N + 1) return name(bad);
  const ParamGroup wg = params.gather(N + 1);
  const TensorBuffer hn = final_norm_forward(h, bind_head(m_, wg).final_norm);
  bad = first_over_ranks(N + 1, all_finite(dev_, hn));
  return bad <= N + 1 ? name(bad) : std::string();
}

}  // namespace untied

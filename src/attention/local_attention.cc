// The `local` strategy: one rank, the whole sequence, no exchange. The reference every other
// strategy must reproduce; written as plainly as possible (whole-tensor GEMMs, one kernel call).
#include "attention/local_attention.h"

#include "attention/block_ops.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::attn {

LocalAttention::LocalAttention(Device& dev, const AttentionConfig& cfg)
    : dev_(dev), cfg_(cfg), rows_{TokenSegment{.first_row = 0, .first_position = 0, .length = cfg.seq}} {}

AttentionShape LocalAttention::kernel_shape(const SavedMask& m) const {
  return masked(AttentionShape{.seq_q = cfg_.seq, .seq_k = cfg_.seq, .heads = cfg_.heads, .kv_heads = cfg_.kv_heads,
                        .head_dim = cfg_.head_dim, .causal = true, .dtype = cfg_.dtype}, m);
}

void LocalAttention::forward(const Tensor& y, const Tensor& x, const AttentionWeights& w, const SequenceMask& mask,
                             AttentionSaved& saved) {
  check_tensors(cfg_, cfg_.seq, x, w, y);
  check_mask(cfg_, mask);
  const int64_t S = cfg_.seq, E = cfg_.hidden, H = cfg_.heads, G = cfg_.kv_heads, D = cfg_.head_dim;
  const DType t = cfg_.dtype;
  Allocator& alloc = dev_.allocator();
  // output_kept (AttentionSaved): the output and LSE are an earlier forward's; q, k and v are
  // made again for the backward, and no attention runs.
  const bool rerun = saved.output_kept;
  if (rerun) {
    UNTIED_CHECK(saved.stages.size() == 1 && saved.rounds.size() == 1 && saved.attn_out.view().ndim() > 0 &&
                     saved.mask.mask.seq() == mask.seq(),
                 "attention forward: output_kept without a matching earlier forward");
  } else {
    saved.reset();
    keep_mask(dev_, mask, rows_, rows_, saved.mask);
    // One stage of every head, one round of every KV head.
    saved.stages.emplace_back();
    saved.rounds.emplace_back();
  }
  const RowPositions pos = rope_positions(saved.mask);
  SavedStage& st = saved.stages[0];
  SavedRound& rd = saved.rounds[0];
  TensorBuffer &q = st.q, &k = rd.k, &v = rd.v;
  q = TensorBuffer(alloc, t, {S, H, D}, Tag::kAttnWorkspace, "q (local)");
  k = TensorBuffer(alloc, t, {S, G, D}, Tag::kAttnWorkspace, "k (local)");
  v = TensorBuffer(alloc, t, {S, G, D}, Tag::kAttnWorkspace, "v (local)");
  // q = x wq^T, k = x wk^T, v = x wv^T
  // (+ bq, bk, bv with qkv_bias)
  for (auto [dst, wt, bias, n] : {std::tuple{&q, &w.wq, &w.bq, H * D}, {&k, &w.wk, &w.bk, G * D},
                                  {&v, &w.wv, &w.bv, G * D}}) {
    gemm(dev_, GemmParams{.trans_b = true, .m = S, .n = n, .k = E, .a = x.data(), .lda = E, .a_dtype = x.dtype(),
                          .b = wt->data(), .ldb = E, .b_dtype = wt->dtype(), .c = dst->data(), .ldc = n, .c_dtype = t});
    if (cfg_.qkv_bias) add_bias(dev_, dst->data(), t, n, S, n, bias->data(), bias->dtype());
  }
  // Qwen3: per-head RMSNorm of q and k before RoPE; the pre-norm tensors are kept for backward.
  if (cfg_.qk_norm) {
    QkNorm qk(dev_, cfg_, QkGrads::kNone);
    st.q_norm.pre = std::move(q);
    rd.k_norm.pre = std::move(k);
    q = qk.forward(st.q_norm.pre, w.q_norm, &st.q_norm.rstd, "q (normed, local)");
    k = qk.forward(rd.k_norm.pre, w.k_norm, &rd.k_norm.rstd, "k (normed, local)");
  }
  rope_blocks(dev_, q.data(), t, 1, S, H, D, cfg_.rope_theta, cfg_.rope_scaling, pos, Rope::kForward);
  rope_blocks(dev_, k.data(), t, 1, S, G, D, cfg_.rope_theta, cfg_.rope_scaling, pos, Rope::kForward);
  if (!rerun) {
    saved.attn_out = TensorBuffer(alloc, t, {S, H, D}, Tag::kActivations, "attention output (saved)");
    st.lse = TensorBuffer(alloc, DType::kF32, {H, S}, Tag::kActivations, "attention LSE (saved)");
    attention_forward(dev_, kernel_shape(saved.mask),
                      {.out = saved.attn_out.data(), .lse = st.lse.as<float>(), .q = q.data(), .k = k.data(),
                       .v = v.data()});
  }
  // y = attn_out wo^T
  gemm(dev_, GemmParams{.trans_b = true, .m = S, .n = E, .k = H * D, .a = saved.attn_out.data(), .lda = H * D,
                        .a_dtype = t, .b = w.wo.data(), .ldb = H * D, .b_dtype = w.wo.dtype(), .c = y.data(), .ldc = E,
                        .c_dtype = y.dtype()});
}

void LocalAttention::backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x,
                              const AttentionWeights& w, AttentionSaved& saved) {
  check_tensors(cfg_, cfg_.seq, x, w, dy);
  check_grads(cfg_, cfg_.seq, dx, g);
  const int64_t S = cfg_.seq, E = cfg_.hidden, H = cfg_.heads, G = cfg_.kv_heads, D = cfg_.head_dim;
  const DType t = cfg_.dtype;
  Allocator& alloc = dev_.allocator();
  UNTIED_CHECK(saved.stages.size() == 1 && saved.rounds.size() == 1, "attention backward without a matching forward");
  const SavedStage& st = saved.stages[0];
  const SavedRound& rd = saved.rounds[0];
  const Tensor &q = st.q, &k = rd.k, &v = rd.v;
  // dwo = dy^T attn_out;  dout = dy wo
  gemm(dev_, GemmParams{.trans_a = true, .m = E, .n = H * D, .k = S, .a = dy.data(), .lda = E, .a_dtype = dy.dtype(),
                        .b = saved.attn_out.data(), .ldb = H * D, .b_dtype = t, .c = g.dwo.data(), .ldc = H * D,
                        .c_dtype = g.dwo.dtype()});
  TensorBuffer dout(alloc, t, {S, H, D}, Tag::kAttnWorkspace, "dout (local)");
  gemm(dev_, GemmParams{.m = S, .n = H * D, .k = E, .a = dy.data(), .lda = E, .a_dtype = dy.dtype(), .b = w.wo.data(),
                        .ldb = H * D, .b_dtype = w.wo.dtype(), .c = dout.data(), .ldc = H * D, .c_dtype = t});
  TensorBuffer dq(alloc, t, {S, H, D}, Tag::kAttnWorkspace, "dq (local)");
  TensorBuffer dk(alloc, t, {S, G, D}, Tag::kAttnWorkspace, "dk (local)");
  TensorBuffer dv(alloc, t, {S, G, D}, Tag::kAttnWorkspace, "dv (local)");
  attention_backward(dev_, kernel_shape(saved.mask),
                     {.dq = dq.data(), .dk = dk.data(), .dv = dv.data(), .q = q.data(), .k = k.data(), .v = v.data(),
                      .out = saved.attn_out.data(), .lse = st.lse.as<float>(), .dout = dout.data()});
  const RowPositions pos = rope_positions(saved.mask);
  rope_blocks(dev_, dq.data(), t, 1, S, H, D, cfg_.rope_theta, cfg_.rope_scaling, pos, Rope::kInverse);
  rope_blocks(dev_, dk.data(), t, 1, S, G, D, cfg_.rope_theta, cfg_.rope_scaling, pos, Rope::kInverse);
  QkNorm qk(dev_, cfg_, QkGrads::kAccumulate);
  if (qk.on()) {
    dq = qk.backward(QkPart::kQ, st.q_norm.pre, st.q_norm.rstd, w.q_norm, dq);
    dk = qk.backward(QkPart::kK, rd.k_norm.pre, rd.k_norm.rstd, w.k_norm, dk);
  }
  // dx = dq wq + dk wk + dv wv (fp32 accumulation);  dw = d^T x;  db = column sums of d (qkv_bias)
  Buffer dx_acc_buf;
  float* dx_acc = dx.as<float>();
  if (dx.dtype() != DType::kF32) {
    dx_acc_buf = alloc.allocate(S * E * 4, Tag::kOther, "dx fp32 accumulator");
    dx_acc = dx_acc_buf.as<float>();
  }
  float beta = 0.0f;
  for (auto [d, wt, dw, db, n] : {std::tuple{&dq, &w.wq, &g.dwq, &g.dbq, H * D}, {&dk, &w.wk, &g.dwk, &g.dbk, G * D},
                                  {&dv, &w.wv, &g.dwv, &g.dbv, G * D}}) {
    if (cfg_.qkv_bias) bias_grad(dev_, db->data(), db->dtype(), d->data(), t, n, S, n, false);
    gemm(dev_, GemmParams{.m = S, .n = E, .k = n, .beta = beta, .a = d->data(), .lda = n, .a_dtype = t,
                          .b = wt->data(), .ldb = E, .b_dtype = wt->dtype(), .c = dx_acc, .ldc = E});
    gemm(dev_, GemmParams{.trans_a = true, .m = n, .n = E, .k = S, .a = d->data(), .lda = n, .a_dtype = t,
                          .b = x.data(), .ldb = E, .b_dtype = x.dtype(), .c = dw->data(), .ldc = E,
                          .c_dtype = dw->dtype()});
    beta = 1.0f;
  }
  if (dx.dtype() != DType::kF32) convert(dev_, dx.data(), dx.dtype(), dx_acc, DType::kF32, S * E);
  qk.store_grads(g);
  saved.reset();
}

}  // namespace untied::attn

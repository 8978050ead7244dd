// Ulysses and UPipe: the sequence-sharded block run as stages of heads (head_schedule.h).
//
// One stage on rank r (buffers are packed by destination rank p: [C][L][n][D]):
//   q_send[p][:, j]  = RoPE(x wq[h(s,p,j)]^T)        projection written straight in send layout
//   q_recv (S, u, D) = all_to_all(q_send)            sequence -> heads
//   first stage of a round: k_res, v_res (S, w, D) the same way, resident for the round
//   o (S, u, D), lse (u, S) = attention(q_recv, k_res, v_res)
//   o_recv[p][:, j]  = all_to_all(o)                 heads -> sequence (o is already packed:
//                                                    its rows are the C sequence blocks)
//   attn_out[:, h(s,p,j)] = o_recv[p][:, j]          into the preallocated (L, H, D) output
// y = attn_out wo^T.
// Backward walks the stages again: recompute (upipe) or reuse (ulysses) q/k/v; dO for the
// stage's heads is projected from dy straight into send layout and exchanged, with
// D_i = rowsum(dO * O) computed before the exchange where O is local; the kernel gives dq, dk,
// dv; dq is exchanged back at once, dk/dv (summed over the round's stages in fp32) once per
// round, in the block's dtype.
#include "attention/head_pipeline.h"

#include "attention/block_ops.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::attn {

HeadPipeline::HeadPipeline(Device& dev, Communicator& comm, const AttentionConfig& cfg, bool recompute)
    : dev_(dev), comm_(comm), cfg_(cfg), recompute_(recompute) {
  const int64_t U = cfg.strategy == Strategy::kUPipe ? (cfg.upipe_heads > 0 ? cfg.upipe_heads : comm.size())
                                                     : cfg.heads;
  sched_ = make_head_schedule(cfg.heads, cfg.kv_heads, comm.size(), U).value();
  rows_ = cfg.seq / comm.size();
  first_position_ = comm.rank() * rows_;
}

// Per-stage buffers: projections in send layout, their exchange, the kernel's output.
struct HeadPipeline::Stage {
  TensorBuffer q_recv, k_res, v_res, o;
  // qk_norm, backward only: pre-norm projections (send layout) and their rstd, kept until the
  // gradients come back (q for the stage, k for the round).
  TensorBuffer q_pre, q_rstd, k_pre, k_rstd;
};

void HeadPipeline::project_exchange(const AttentionWeights& w, const Tensor& x, int64_t s, bool kv, Stage& st,
                                    bool keep_pre) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, u = sched_.q_per_rank, nkv = sched_.kv_per_rank;
  const DType t = cfg_.dtype;
  const int64_t es = dtype_size(t);
  QkNorm qk(dev_, cfg_, /*grads=*/false);
  // With qk_norm the projection is normalised per head into a new send buffer; the pre-norm
  // projection and rstd are kept for backward when asked.
  auto normalise = [&](TensorBuffer& send, const Tensor& wn, TensorBuffer* pre, TensorBuffer* rstd) {
    if (!qk.on()) return;
    TensorBuffer r, normed = qk.forward(send, wn, &r, "q/k normed (send layout)");
    if (keep_pre) {
      *pre = std::move(send);
      *rstd = std::move(r);
    }
    send = std::move(normed);
  };
  {
    TensorBuffer q_send(dev_.allocator(), t, {C, L, u, D}, Tag::kAttnWorkspace, "q projection (send layout)");
    for (int64_t p = 0; p < C; ++p)
      for (int64_t j = 0; j < u; ++j)
        project_head(dev_, q_send.as<char>() + (p * L * u + j) * D * es, u * D, t, x.data(), x.dtype(), L, w.wq,
                     sched_.q_head(s, p, j), D);
    normalise(q_send, w.q_norm, &st.q_pre, &st.q_rstd);
    rope_blocks(dev_, q_send.data(), t, C, L, u, D, cfg_.rope_theta, first_position_, false);
    st.q_recv = TensorBuffer(dev_.allocator(), t, {C * L, u, D}, Tag::kCommunication, "q all-to-all receive");
    exchange(dev_, comm_, q_send.data(), st.q_recv.data(), L * u * D * es);
  }
  if (!kv) return;
  const int64_t round = sched_.round(s);
  for (int which = 0; which < 2; ++which) {
    const Tensor& wt = which == 0 ? w.wk : w.wv;
    TensorBuffer send(dev_.allocator(), t, {C, L, nkv, D}, Tag::kAttnWorkspace,
                      which == 0 ? "k projection (send layout)" : "v projection (send layout)");
    for (int64_t p = 0; p < C; ++p)
      for (int64_t i = 0; i < nkv; ++i)
        project_head(dev_, send.as<char>() + (p * L * nkv + i) * D * es, nkv * D, t, x.data(), x.dtype(), L, wt,
                     sched_.kv_head(round, p, i), D);
    if (which == 0) {
      normalise(send, w.k_norm, &st.k_pre, &st.k_rstd);
      rope_blocks(dev_, send.data(), t, C, L, nkv, D, cfg_.rope_theta, first_position_, false);
    }
    TensorBuffer& res = which == 0 ? st.k_res : st.v_res;
    res = TensorBuffer(dev_.allocator(), t, {C * L, nkv, D}, Tag::kCommunication,
                       which == 0 ? "k all-to-all receive (resident)" : "v all-to-all receive (resident)");
    exchange(dev_, comm_, send.data(), res.data(), L * nkv * D * es);
  }
}

AttentionShape HeadPipeline::kernel_shape() const {
  return AttentionShape{.seq_q = cfg_.seq, .seq_k = cfg_.seq, .heads = sched_.q_per_rank,
                        .kv_heads = sched_.kv_per_rank, .head_dim = cfg_.head_dim, .causal = true,
                        .dtype = cfg_.dtype};
}

void HeadPipeline::forward(const Tensor& y, const Tensor& x, const AttentionWeights& w, AttentionSaved& saved) {
  check_tensors(cfg_, rows_, x, w, y);
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, H = cfg_.heads, u = sched_.q_per_rank;
  const DType t = cfg_.dtype;
  const int64_t es = dtype_size(t);
  Allocator& alloc = dev_.allocator();
  saved.reset();
  saved.attn_out = TensorBuffer(alloc, t, {L, H, D}, Tag::kActivations, "attention output (saved)");

  Stage st;
  for (int64_t s = 0; s < sched_.stages; ++s) {
    project_exchange(w, x, s, sched_.first_of_round(s), st, /*keep_pre=*/!recompute_);
    st.o = TensorBuffer(alloc, t, {C * L, u, D}, Tag::kAttnWorkspace, "attention output (head-sharded)");
    saved.lse.emplace_back(alloc, DType::kF32, Shape{u, C * L}, Tag::kActivations, "attention LSE (saved)");
    attention_forward(dev_, kernel_shape(), st.o.data(), saved.lse.back().as<float>(), st.q_recv.data(),
                      st.k_res.data(), st.v_res.data());
    {
      TensorBuffer o_recv(alloc, t, {C, L, u, D}, Tag::kCommunication, "attention output all-to-all receive");
      exchange(dev_, comm_, st.o.data(), o_recv.data(), L * u * D * es);
      for (int64_t p = 0; p < C; ++p)  // o_recv[p][:, j] -> attn_out[:, h(s, p, j)]
        for (int64_t j = 0; j < u; ++j)
          dev_.copy_2d(saved.attn_out.as<char>() + sched_.q_head(s, p, j) * D * es, H * D * es,
                       o_recv.as<char>() + (p * L * u + j) * D * es, u * D * es, D * es, L);
    }
    if (recompute_) {
      st.q_recv.reset();
      st.o.reset();
      if (sched_.last_of_round(s)) {
        st.k_res.reset();
        st.v_res.reset();
      }
    } else {
      saved.qkv_out.push_back(std::move(st.q_recv));
      if (sched_.first_of_round(s)) {
        saved.qkv_out.push_back(std::move(st.k_res));
        saved.qkv_out.push_back(std::move(st.v_res));
      }
      saved.qkv_out.push_back(std::move(st.o));
      if (cfg_.qk_norm) {
        saved.qkv_out.push_back(std::move(st.q_pre));
        saved.qkv_out.push_back(std::move(st.q_rstd));
        if (sched_.first_of_round(s)) {
          saved.qkv_out.push_back(std::move(st.k_pre));
          saved.qkv_out.push_back(std::move(st.k_rstd));
        }
      }
    }
  }
  // y (L, E) = attn_out (L, H*D) wo^T
  gemm(dev_, GemmParams{.trans_b = true, .m = L, .n = cfg_.hidden, .k = H * D, .a = saved.attn_out.data(),
                        .lda = H * D, .a_dtype = t, .b = w.wo.data(), .ldb = H * D, .b_dtype = w.wo.dtype(),
                        .c = y.data(), .ldc = cfg_.hidden, .c_dtype = y.dtype()});
}

void HeadPipeline::backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x,
                            const AttentionWeights& w, AttentionSaved& saved) {
  check_tensors(cfg_, rows_, x, w, dy);
  check_grads(cfg_, rows_, dx, g);
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, H = cfg_.heads, E = cfg_.hidden;
  const int64_t u = sched_.q_per_rank, wk = sched_.kv_per_rank;
  const DType t = cfg_.dtype;
  const int64_t es = dtype_size(t);
  Allocator& alloc = dev_.allocator();
  UNTIED_CHECK(static_cast<int64_t>(saved.lse.size()) == sched_.stages,
               "attention backward without a matching forward (", saved.lse.size(), " saved stages, expected ",
               sched_.stages, ")");

  // dwo (E, H*D) = dy^T attn_out
  gemm(dev_, GemmParams{.trans_a = true, .m = E, .n = H * D, .k = L, .a = dy.data(), .lda = E, .a_dtype = dy.dtype(),
                        .b = saved.attn_out.data(),
                        .ldb = H * D, .b_dtype = t, .c = g.dwo.data(), .ldc = H * D, .c_dtype = g.dwo.dtype()});
  // dx accumulates in fp32; dwk/dwv accumulate over KV replicas.
  Buffer dx_acc_buf;
  float* dx_acc = dx.as<float>();
  if (dx.dtype() != DType::kF32) {
    dx_acc_buf = alloc.allocate(L * E * 4, Tag::kOther, "dx fp32 accumulator");
    dx_acc = dx_acc_buf.as<float>();
  }
  dev_.fill_zero(dx_acc, L * E * 4);
  dev_.fill_zero(g.dwk.data(), g.dwk.bytes());
  dev_.fill_zero(g.dwv.data(), g.dwv.bytes());

  QkNorm qk(dev_, cfg_, /*grads=*/true);
  Stage st;
  size_t saved_idx = 0;
  TensorBuffer dk_acc, dv_acc;  // (S, w, D) fp32, per round
  for (int64_t s = 0; s < sched_.stages; ++s) {
    const int64_t round = sched_.round(s);
    if (recompute_) {
      project_exchange(w, x, s, sched_.first_of_round(s), st, /*keep_pre=*/true);
    } else {
      st.q_recv = std::move(saved.qkv_out[saved_idx++]);
      if (sched_.first_of_round(s)) {
        st.k_res = std::move(saved.qkv_out[saved_idx++]);
        st.v_res = std::move(saved.qkv_out[saved_idx++]);
      }
      st.o = std::move(saved.qkv_out[saved_idx++]);
      if (cfg_.qk_norm) {
        st.q_pre = std::move(saved.qkv_out[saved_idx++]);
        st.q_rstd = std::move(saved.qkv_out[saved_idx++]);
        if (sched_.first_of_round(s)) {
          st.k_pre = std::move(saved.qkv_out[saved_idx++]);
          st.k_rstd = std::move(saved.qkv_out[saved_idx++]);
        }
      }
    }
    if (sched_.first_of_round(s)) {
      dk_acc = TensorBuffer(alloc, DType::kF32, {C * L, wk, D}, Tag::kAttnWorkspace, "dk accumulator (round)");
      dv_acc = TensorBuffer(alloc, DType::kF32, {C * L, wk, D}, Tag::kAttnWorkspace, "dv accumulator (round)");
      dev_.fill_zero(dk_acc.data(), dk_acc.view().bytes());
      dev_.fill_zero(dv_acc.data(), dv_acc.view().bytes());
    }
    // dO for the stage's heads, in send layout, and D = rowsum(dO * O) where both are local.
    TensorBuffer do_recv(alloc, t, {C * L, u, D}, Tag::kCommunication, "dO all-to-all receive");
    TensorBuffer delta(alloc, DType::kF32, {u, C * L}, Tag::kAttnWorkspace, "attention D (head-sharded)");
    {
      TensorBuffer do_send(alloc, t, {C, L, u, D}, Tag::kAttnWorkspace, "dO projection (send layout)");
      TensorBuffer delta_send(alloc, DType::kF32, {C, u, L}, Tag::kAttnWorkspace, "attention D (send layout)");
      TensorBuffer delta_recv(alloc, DType::kF32, {C, u, L}, Tag::kCommunication, "attention D receive");
      for (int64_t p = 0; p < C; ++p)
        for (int64_t j = 0; j < u; ++j)
          project_out_grad_head(dev_, do_send.as<char>() + (p * L * u + j) * D * es, u * D, t, dy.data(), dy.dtype(),
                                L, w.wo, sched_.q_head(s, p, j), D);
      // delta_send[p][j][i] = O[i, h(s, p, j)] . dO_send[p][i][j]
      for (int64_t p = 0; p < C; ++p)
        for (int64_t j = 0; j < u; ++j)
          row_dot(dev_, L, D, t, saved.attn_out.as<char>() + sched_.q_head(s, p, j) * D * es, H * D,
                  do_send.as<char>() + (p * L * u + j) * D * es, u * D, delta_send.as<float>() + (p * u + j) * L, 1);
      exchange(dev_, comm_, do_send.data(), do_recv.data(), L * u * D * es);
      exchange(dev_, comm_, delta_send.data(), delta_recv.data(), L * u * 4);
      // delta_recv [src][j][i] -> delta [j][src*L + i] (the kernel's (heads, seq) layout)
      for (int64_t src = 0; src < C; ++src)
        dev_.copy_2d(delta.as<float>() + src * L, C * L * 4, delta_recv.as<float>() + src * u * L, L * 4, L * 4, u);
    }
    TensorBuffer dq(alloc, t, {C * L, u, D}, Tag::kAttnWorkspace, "dq (head-sharded)");
    TensorBuffer dk(alloc, t, {C * L, wk, D}, Tag::kAttnWorkspace, "dk (head-sharded, stage)");
    TensorBuffer dv(alloc, t, {C * L, wk, D}, Tag::kAttnWorkspace, "dv (head-sharded, stage)");
    attention_backward_with_delta(dev_, kernel_shape(), dq.data(), dk.data(), dv.data(), st.q_recv.data(),
                                  st.k_res.data(), st.v_res.data(), delta.as<float>(), saved.lse[s].as<float>(),
                                  do_recv.data());
    do_recv.reset();
    delta.reset();
    st.q_recv.reset();
    st.o.reset();
    add_into(dev_, dk_acc.data(), DType::kF32, dk.data(), t, C * L * wk * D);
    add_into(dev_, dv_acc.data(), DType::kF32, dv.data(), t, C * L * wk * D);
    dk.reset();
    dv.reset();
    {
      // dq back to sequence sharding; inverse RoPE; dx and dwq for each head.
      TensorBuffer dq_recv(alloc, t, {C, L, u, D}, Tag::kCommunication, "dq all-to-all receive");
      exchange(dev_, comm_, dq.data(), dq_recv.data(), L * u * D * es);
      dq.reset();
      rope_blocks(dev_, dq_recv.data(), t, C, L, u, D, cfg_.rope_theta, first_position_, true);
      if (qk.on()) {  // through the per-head q norm
        dq_recv = qk.backward(true, st.q_pre, st.q_rstd, w.q_norm, dq_recv);
        st.q_pre.reset();
        st.q_rstd.reset();
      }
      for (int64_t p = 0; p < C; ++p)
        for (int64_t j = 0; j < u; ++j)
          project_head_backward(dev_, dx_acc, dq_recv.as<char>() + (p * L * u + j) * D * es, u * D, t, x.data(),
                                x.dtype(), L, w.wq, g.dwq, sched_.q_head(s, p, j), D, false);
    }
    if (sched_.last_of_round(s)) {
      st.k_res.reset();
      st.v_res.reset();
      for (int pass = 0; pass < 2; ++pass) {
        TensorBuffer& acc = pass == 0 ? dk_acc : dv_acc;
        // The round's sums, RoPE undone (acc's rows are the whole sequence in order), go back
        // in the block's dtype, as dq does: half the bytes of fp32 for bf16, and every GEMM
        // operand of the projection backward in one dtype.
        if (pass == 0) rope_blocks(dev_, acc.data(), DType::kF32, 1, C * L, wk, D, cfg_.rope_theta, 0, true);
        TensorBuffer send;
        if (t != DType::kF32) {
          send = TensorBuffer(alloc, t, {C * L, wk, D}, Tag::kCommunication,
                              pass == 0 ? "dk all-to-all send" : "dv all-to-all send");
          convert(dev_, send.data(), t, acc.data(), DType::kF32, C * L * wk * D);
          acc.reset();
        }
        TensorBuffer recv(alloc, t, {C, L, wk, D}, Tag::kCommunication,
                          pass == 0 ? "dk all-to-all receive" : "dv all-to-all receive");
        exchange(dev_, comm_, (t != DType::kF32 ? send : acc).data(), recv.data(), L * wk * D * es);
        send.reset();
        acc.reset();
        const void* grad = recv.data();
        TensorBuffer dk_pre;
        if (pass == 0 && qk.on()) {  // through the per-head k norm
          dk_pre = qk.backward(false, st.k_pre, st.k_rstd, w.k_norm, recv);
          st.k_pre.reset();
          st.k_rstd.reset();
          grad = dk_pre.data();
        }
        for (int64_t p = 0; p < C; ++p)
          for (int64_t i = 0; i < wk; ++i)
            project_head_backward(dev_, dx_acc, static_cast<const char*>(grad) + (p * L * wk + i) * D * es, wk * D, t,
                                  x.data(), x.dtype(), L, pass == 0 ? w.wk : w.wv, pass == 0 ? g.dwk : g.dwv,
                                  sched_.kv_head(round, p, i), D, true);
      }
    }
  }
  if (dx.dtype() != DType::kF32) convert(dev_, dx.data(), dx.dtype(), dx_acc, DType::kF32, L * E);
  qk.store_grads(g);
  saved.reset();
}

}  // namespace untied::attn

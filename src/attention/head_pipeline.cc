// Ulysses and UPipe: the sequence-sharded block run as stages of heads (head_schedule.h).
//
// Send and receive buffers are packed by rank, [C][L][n][D] (PackedHeads, block_ops.h). One
// stage s on rank r, forward (run_forward):
//   project_q      q_send[p][:, j] = RoPE(norm(x wq[h(s,p,j)]^T)) for every rank p at once: one
//                  GEMM over the stage's heads of all C blocks (project_blocks), a run of at most
//                  kProjectionRows rows at a time, written straight in send layout
//                  st.q (Sg, u, D) = all_to_all(q_send)               sequence -> heads
//   project_kv     first stage of round t: rd.k, rd.v (Sg, w, D) the same way, resident for the round
//   attention      st.o (Sg, u, D), st.lse (u, Sg) = attention(st.q, rd.k, rd.v); under a ring
//                  (R > 1) ring attention over the R groups instead (ring_attention.h)
//   start_output   o_recv = all_to_all(st.o)                          heads -> sequence (st.o is
//                  already packed: its rows are the C sequence blocks)
//   place_output   attn_out[:, h(s,p,j)] = o_recv[p][:, j]           into the preallocated (L, H, D)
// then project_output: y = attn_out wo^T (whole, or a tile of rows at a time: TiledOutput).
// With overlap, stage s+1's projections and exchanges are started before stage s's attention,
// and stage s's output goes back while stage s+1 runs. With a kept output (a selective recompute:
// AttentionSaved::output_kept) rerun_forward replaces all this: the attention and its exchanges
// do not run again, ulysses and ring project q, k and v again for the backward, and y comes from
// the kept output.
// Backward (run_backward): dwo = dy^T attn_out; with early_delta, D = rowsum(dO * O) of every
// head first (the dO of U heads at a time) and the saved output freed. Then the stages again,
// last first, each one the forward in reverse:
//   recompute (upipe) or take from `saved` (ulysses; upipe's last stage, which forward keeps when
//                     AttentionSaved::keep_last_stage asks) st.q, rd.k, rd.v
//   start_dout        dO for the stage's heads, projected from dy straight into send layout, its
//                     exchange started, with D computed before it where O is local (no early_delta)
//   finish_dout       the exchange waited for
//   attention backward dq, dk, dv; dk/dv summed over the round's stages in fp32
//   start_dq, finish_dq  dq back to the sequence, RoPE and the q norm undone, into dx, dwq
//   return_round_dkv  first stage of a round (the last run): the round's dk/dv sums back, in the
//                     block's dtype, RoPE and the k norm undone, into dx, dwk, dwv
// With dx handed out by tiles (TiledGrad), the returned dq of each stage and dk/dv of each round
// are kept instead (DxStash) and hand_out_dx forms dx from them a tile of rows at a time.
#include "attention/head_pipeline.h"

#include "untied/kernels/attention.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::attn {

namespace {

// qk_norm: send (any shape, D-vectors) = norm(send) per head, into a new buffer. The pre-norm
// projection and its rstd go to `kept` (KeepNorm::kYes: backward needs them) or are freed.
void normalise(Device& dev, const AttentionConfig& cfg, TensorBuffer& send, const Tensor& norm_w, KeepNorm keep,
               SavedQkNorm& kept) {
  QkNorm qk(dev, cfg, QkGrads::kNone);
  if (!qk.on()) return;
  TensorBuffer rstd, normed = qk.forward(send, norm_w, &rstd, "q/k normed (send layout)");
  if (keep == KeepNorm::kYes) {
    kept.pre = std::move(send);
    kept.rstd = std::move(rstd);
  }
  send = std::move(normed);
}

}  // namespace

HeadPipeline::HeadPipeline(Device& dev, Communicator& comm, const AttentionConfig& cfg, Saving saving)
    : dev_(dev), cfg_(cfg), saving_(saving), overlap_(false), layout_(token_layout(cfg, comm.size())), ulysses_(&comm) {
  const int R = layout_.ring(), C = layout_.group(), r = comm.rank();
  if (R > 1) {  // collective: every rank splits the same way
    group_comm_ = comm.split(/*color=*/r / C, /*key=*/r % C);
    ring_comm_ = comm.split(/*color=*/r % C, /*key=*/r / C);
    ulysses_ = group_comm_.get();
  }
  sched_ = make_head_schedule(cfg.heads, cfg.kv_heads, C, stage_heads_of(cfg, comm.size())).value();
  overlap_ = cfg.overlap && sched_.stages > 1;
  rows_ = layout_.local_tokens();
  seq_group_ = layout_.group_tokens();
  positions_ = layout_.rank_segments(r);
  group_positions_ = layout_.group_segments(r / C);
  if (R > 1)
    ring_ = std::make_unique<RingAttention>(dev, *ring_comm_, layout_, sched_.q_per_rank, sched_.kv_per_rank,
                                            cfg.head_dim, cfg.dtype, cfg.ring_overlap);
}

std::vector<int64_t> HeadPipeline::q_heads(int64_t s, int64_t p) const {
  std::vector<int64_t> h(static_cast<size_t>(sched_.q_per_rank));
  for (int64_t j = 0; j < sched_.q_per_rank; ++j) h[static_cast<size_t>(j)] = sched_.q_head(s, p, j);
  return h;
}

std::vector<int64_t> HeadPipeline::kv_heads(int64_t round, int64_t p) const {
  std::vector<int64_t> h(static_cast<size_t>(sched_.kv_per_rank));
  for (int64_t i = 0; i < sched_.kv_per_rank; ++i) h[static_cast<size_t>(i)] = sched_.kv_head(round, p, i);
  return h;
}

std::vector<std::vector<int64_t>> HeadPipeline::q_heads_of_blocks(int64_t s) const {
  std::vector<std::vector<int64_t>> out;
  for (int64_t p = 0; p < sched_.ranks; ++p) out.push_back(q_heads(s, p));
  return out;
}

std::vector<std::vector<int64_t>> HeadPipeline::kv_heads_of_blocks(int64_t t) const {
  std::vector<std::vector<int64_t>> out;
  for (int64_t p = 0; p < sched_.ranks; ++p) out.push_back(kv_heads(t, p));
  return out;
}

PackedHeads HeadPipeline::packed(void* base, int64_t heads, int64_t elem_bytes) const {
  return PackedHeads{.base = base, .rows = rows_, .heads = heads, .d = cfg_.head_dim, .elem_bytes = elem_bytes};
}

AttentionShape HeadPipeline::kernel_shape() const {
  return masked(AttentionShape{.seq_q = seq_group_, .seq_k = seq_group_, .heads = sched_.q_per_rank,
                               .kv_heads = sched_.kv_per_rank, .head_dim = cfg_.head_dim, .causal = true,
                               .dtype = cfg_.dtype},
                *mask_);
}

RowPositions HeadPipeline::rank_rows() const { return {.segments = &positions_, .table = mask_->rope_rows.as<int64_t>()}; }

RowPositions HeadPipeline::group_rows() const {
  return {.segments = &group_positions_, .table = mask_->rope_group.as<int64_t>()};
}

void HeadPipeline::project_q(const AttentionWeights& w, const InputRows& x, int64_t s, SavedStage& st, KeepNorm keep,
                             Exchanges& ex) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, u = sched_.q_per_rank;
  const DType t = cfg_.dtype;
  TensorBuffer send(dev_.allocator(), t, {C, L, u, D}, Tag::kAttnWorkspace, "q projection (send layout)");
  const PackedHeads q = packed(send.data(), u);
  const std::vector<std::vector<int64_t>> heads = q_heads_of_blocks(s);
  x.for_each([&](int64_t r0, int64_t n, const void* xr) {
    project_blocks(dev_, q, r0, t, xr, x.dtype(), n, w.wq, heads, HeadWeights::kRows);
    add_head_biases(dev_, q, r0, n, t, w.bq, heads);
  });
  normalise(dev_, cfg_, send, w.q_norm, keep, st.q_norm);
  rope_blocks(dev_, send.data(), t, C, L, u, D, cfg_.rope_theta, cfg_.rope_scaling, rank_rows(), Rope::kForward);
  st.q = TensorBuffer(dev_.allocator(), t, {C * L, u, D}, Tag::kCommunication, "q all-to-all receive");
  ex.start(std::move(send), st.q.data(), L * u * D * dtype_size(t));
}

void HeadPipeline::project_kv(const AttentionWeights& w, const InputRows& x, int64_t round, SavedRound& rd,
                              KeepNorm keep, Exchanges& ex) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, nkv = sched_.kv_per_rank;
  const DType t = cfg_.dtype;
  // k is normed (qk_norm) and rotated like q; v is neither.
  struct Part {
    const Tensor& w;
    const Tensor& bias;  // empty without qkv_bias
    TensorBuffer& recv;
    const Tensor* norm_w;  // k only
    SavedQkNorm* kept;     // k only
    const char* send_what;
    const char* recv_what;
  };
  const Part parts[] = {
      {w.wk, w.bk, rd.k, &w.k_norm, &rd.k_norm, "k projection (send layout)", "k all-to-all receive (resident)"},
      {w.wv, w.bv, rd.v, nullptr, nullptr, "v projection (send layout)", "v all-to-all receive (resident)"}};
  for (const Part& part : parts) {  // one pass over x each (tiled: k's send goes before v's is made)
    TensorBuffer send(dev_.allocator(), t, {C, L, nkv, D}, Tag::kAttnWorkspace, part.send_what);
    const PackedHeads kv = packed(send.data(), nkv);
    const std::vector<std::vector<int64_t>> heads = kv_heads_of_blocks(round);
    x.for_each([&](int64_t r0, int64_t n, const void* xr) {
      project_blocks(dev_, kv, r0, t, xr, x.dtype(), n, part.w, heads, HeadWeights::kRows);
      add_head_biases(dev_, kv, r0, n, t, part.bias, heads);
    });
    if (part.norm_w != nullptr) {
      normalise(dev_, cfg_, send, *part.norm_w, keep, *part.kept);
      rope_blocks(dev_, send.data(), t, C, L, nkv, D, cfg_.rope_theta, cfg_.rope_scaling, rank_rows(), Rope::kForward);
    }
    part.recv = TensorBuffer(dev_.allocator(), t, {C * L, nkv, D}, Tag::kCommunication, part.recv_what);
    ex.start(std::move(send), part.recv.data(), L * nkv * D * dtype_size(t));
  }
}

TensorBuffer HeadPipeline::start_output(const Tensor& o, Exchanges& ex) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, u = sched_.q_per_rank;
  const DType t = cfg_.dtype;
  TensorBuffer recv(dev_.allocator(), t, {C, L, u, D}, Tag::kCommunication, "attention output all-to-all receive");
  ex.start(o.data(), recv.data(), L * u * D * dtype_size(t));
  return recv;
}

void HeadPipeline::place_output(int64_t s, const Tensor& recv, const Tensor& attn_out) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, u = sched_.q_per_rank;
  const int64_t es = dtype_size(cfg_.dtype);
  const PackedHeads from = packed(recv.data(), u), out = packed(attn_out.data(), cfg_.heads);
  for (int64_t p = 0; p < C; ++p)  // o_recv[p][:, j] -> attn_out[:, h(s, p, j)]
    for (int64_t j = 0; j < u; ++j)
      dev_.copy_2d(out.slot(0, sched_.q_head(s, p, j)), out.ld() * es, from.slot(p, j), from.ld() * es, D * es, L);
}

TensorBuffer HeadPipeline::saved_output_fetch(const AttentionSaved& saved) const {
  if (saved.attn_out_host_tile == 0) return TensorBuffer();
  return TensorBuffer(dev_.allocator(), cfg_.dtype, {saved.attn_out_host_tile, cfg_.heads * cfg_.head_dim},
                      Tag::kAttnWorkspace, "attention output rows (tile, fetched)");
}

const char* HeadPipeline::saved_output_rows(const AttentionSaved& saved, int64_t r0, int64_t n,
                                            const TensorBuffer& fetched) const {
  const int64_t row = cfg_.heads * cfg_.head_dim * dtype_size(cfg_.dtype);
  const char* rows = saved.attn_out.data() == nullptr ? nullptr : saved.attn_out.as<char>() + r0 * row;
  if (saved.attn_out_host_tile == 0) return rows;
  dev_.copy(fetched.data(), rows, n * row);
  return fetched.as<char>();
}

void HeadPipeline::forward(const Tensor& y, const Tensor& x, const AttentionWeights& w, const SequenceMask& mask,
                           AttentionSaved& saved) {
  check_tensors(cfg_, rows_, x, w, y);
  run_forward(&y, nullptr, InputRows(x), w, mask, saved);
}

void HeadPipeline::forward(const Tensor& y, const TiledInput& x, const AttentionWeights& w, const SequenceMask& mask,
                           AttentionSaved& saved) {
  check_tensors(cfg_, rows_, y, w, y);  // (x has no tensor to check: y has its shape)
  run_forward(&y, nullptr, InputRows(dev_, x, rows_, cfg_.hidden, cfg_.dtype), w, mask, saved);
}

void HeadPipeline::forward(const TiledOutput& y, const TiledInput& x, const AttentionWeights& w,
                           const SequenceMask& mask, AttentionSaved& saved) {
  check_weights(cfg_, w);
  UNTIED_CHECK(y.tile >= 1 && y.consume, "attention forward: a TiledOutput needs tile >= 1 and consume");
  run_forward(nullptr, &y, InputRows(dev_, x, rows_, cfg_.hidden, cfg_.dtype), w, mask, saved);
}

void HeadPipeline::run_forward(const Tensor* y, const TiledOutput* tiled, const InputRows& x,
                               const AttentionWeights& w, const SequenceMask& mask, AttentionSaved& saved) {
  UNTIED_CHECK((y == nullptr) != (tiled == nullptr), "attention forward: y whole or by tiles, not both");
  check_mask(cfg_, mask);
  const int64_t L = rows_, D = cfg_.head_dim, H = cfg_.heads, u = sched_.q_per_rank;
  const int64_t stages = sched_.stages;
  const DType t = cfg_.dtype;
  Allocator& alloc = dev_.allocator();
  const bool recompute = saving_ == Saving::kRecompute;
  // upipe keeps the last stage's q and its round's k and v when saved.keep_last_stage asks (the
  // backward starts with them); every other stage's are freed once attended to.
  const bool keep_last = recompute && saved.keep_last_stage;
  const int64_t last_round = stages / sched_.stages_per_round - 1;
  // upipe's stage and round kept for the backward; ulysses and ring keep every one.
  auto kept_stage = [&](int64_t s) { return keep_last && s == stages - 1; };
  auto kept_round = [&](int64_t round) { return keep_last && round == last_round; };
  auto keep_norm = [&](bool kept) { return !recompute || kept ? KeepNorm::kYes : KeepNorm::kNo; };
  if (saved.output_kept) {
    rerun_forward(y, tiled, x, w, mask, saved);
    return;
  }
  saved.reset();
  keep_mask(dev_, mask, positions_, group_positions_, saved.mask);
  mask_ = &saved.mask;
  if (tiled != nullptr && tiled->host != nullptr) {  // in host memory, read back by tiles
    UNTIED_CHECK(cfg_.early_delta, "attention forward: a saved output in host memory needs early_delta");
    saved.attn_out = TensorBuffer(*tiled->host, t, {L, H, D}, Tag::kActivations, "attention output (saved, host)");
    saved.attn_out_host_tile = std::min(tiled->tile, L);
  } else {
    saved.attn_out = TensorBuffer(alloc, t, {L, H, D}, Tag::kActivations, "attention output (saved)");
  }
  // Stage s+1 is sent off while stage s is in progress: no reallocation may move stage s.
  saved.stages.reserve(static_cast<size_t>(stages));
  saved.rounds.reserve(static_cast<size_t>(stages / sched_.stages_per_round));
  // Stage s's q, and at a round's first stage its k and v, projected and sent off.
  auto send_inputs = [&](int64_t s, Exchanges& ex) {
    SavedStage& st = saved.stages.emplace_back();
    st.kept = kept_stage(s);
    project_q(w, x, s, st, keep_norm(st.kept), ex);
    if (!sched_.first_of_round(s)) return;
    SavedRound& rd = saved.rounds.emplace_back();
    rd.kept = kept_round(sched_.round(s));
    project_kv(w, x, sched_.round(s), rd, keep_norm(rd.kept), ex);
  };
  // Stage s's output, once its exchange is done, into attn_out; the head-sharded output is freed
  // by every strategy: backward's D = rowsum(dO * O) reads O from attn_out (sequence layout).
  TensorBuffer o_recv;
  auto place = [&](int64_t s, Exchanges& ex) {
    ex.wait();
    place_output(s, o_recv, saved.attn_out);
    o_recv.reset();
    saved.stages[s].o.reset();
  };
  // With overlap, stage s+1's projection and exchange run while stage s is attended to, and
  // stage s's output goes back while stage s+1 is projected (one more stage of inputs is live).
  Exchanges in(dev_, *ulysses_, overlap_), out(dev_, *ulysses_, overlap_);
  send_inputs(0, in);
  for (int64_t s = 0; s < stages; ++s) {
    in.wait();
    if (s + 1 < stages && overlap_) send_inputs(s + 1, in);
    if (s > 0 && overlap_) place(s - 1, out);
    SavedStage& st = saved.stages[s];
    SavedRound& rd = saved.rounds[sched_.round(s)];
    st.o = TensorBuffer(alloc, t, {sched_.ranks * L, u, D}, Tag::kAttnWorkspace, "attention output (head-sharded)");
    st.lse = TensorBuffer(alloc, DType::kF32, {u, sched_.ranks * L}, Tag::kActivations, "attention LSE (saved)");
    if (ring_ != nullptr)
      ring_->forward(*mask_, st.o.data(), st.lse.as<float>(), st.q.data(), rd.k.data(), rd.v.data());
    else
      attention_forward(dev_, kernel_shape(),
                        {.out = st.o.data(), .lse = st.lse.as<float>(), .q = st.q.data(), .k = rd.k.data(),
                         .v = rd.v.data()});
    // upipe: only the LSE stays (and, when asked, the last stage's q, k, v); backward recomputes the rest
    if (recompute && !st.kept) st.q.reset();
    if (recompute && sched_.last_of_round(s) && !rd.kept) rd = SavedRound{};
    o_recv = start_output(st.o, out);
    if (!overlap_) {
      place(s, out);
      if (s + 1 < stages) send_inputs(s + 1, in);
    }
  }
  if (overlap_) place(stages - 1, out);
  project_output(y, tiled, w, saved);
  mask_ = nullptr;
}

void HeadPipeline::rerun_forward(const Tensor* y, const TiledOutput* tiled, const InputRows& x,
                                 const AttentionWeights& w, const SequenceMask& mask, AttentionSaved& saved) {
  const int64_t stages = sched_.stages, rounds = stages / sched_.stages_per_round;
  UNTIED_CHECK(saved.attn_out.view().ndim() > 0, "attention forward: output_kept without a saved output");
  UNTIED_CHECK(static_cast<int64_t>(saved.stages.size()) == stages && static_cast<int64_t>(saved.rounds.size()) == rounds,
               "attention forward: output_kept without a matching earlier forward (", saved.stages.size(),
               " saved stages and ", saved.rounds.size(), " rounds, expected ", stages, " and ", rounds, ")");
  UNTIED_CHECK(saved.mask.mask.seq() == mask.seq(), "attention forward: output_kept with another sequence's mask");
  mask_ = &saved.mask;
  // ulysses and ring keep q, k and v for the backward: projected and exchanged again (one stage,
  // one round). upipe's backward projects its stages' itself.
  if (saving_ == Saving::kKeepStages) {
    Exchanges in(dev_, *ulysses_, /*overlap=*/false);
    for (int64_t s = 0; s < stages; ++s) {
      project_q(w, x, s, saved.stages[s], KeepNorm::kYes, in);
      if (sched_.first_of_round(s)) project_kv(w, x, sched_.round(s), saved.rounds[sched_.round(s)], KeepNorm::kYes, in);
      in.wait();
    }
  }
  project_output(y, tiled, w, saved);
  mask_ = nullptr;
}

void HeadPipeline::project_output(const Tensor* y, const TiledOutput* tiled, const AttentionWeights& w,
                                  const AttentionSaved& saved) {
  const int64_t L = rows_, D = cfg_.head_dim, H = cfg_.heads, E = cfg_.hidden;
  const DType t = cfg_.dtype;
  Allocator& alloc = dev_.allocator();
  // y (L, E) = attn_out (L, H*D) wo^T: whole, or a tile of rows at a time (attn_out's rows fetched
  // first when it is in host memory)
  const TensorBuffer o_rows = saved_output_fetch(saved);
  auto project = [&](int64_t r0, int64_t n, void* out) {
    gemm(dev_, GemmParams{.trans_b = true, .m = n, .n = E, .k = H * D, .a = saved_output_rows(saved, r0, n, o_rows),
                          .lda = H * D, .a_dtype = t, .b = w.wo.data(), .ldb = H * D, .b_dtype = w.wo.dtype(),
                          .c = out, .ldc = E, .c_dtype = t});
  };
  if (y != nullptr) {
    project(0, L, y->data());
  } else {
    TensorBuffer tile(alloc, t, {std::min(tiled->tile, L), E}, Tag::kOther, "attention block output (tile)");
    for (int64_t r0 = 0; r0 < L; r0 += tiled->tile) {
      const int64_t n = std::min(tiled->tile, L - r0);
      project(r0, n, tile.data());
      tiled->consume(r0, n, tile.data());
    }
  }
}

// dO (S, u, D) of one stage, head-sharded, and D = rowsum(dO * O) in the kernel's (u, S) layout
// (delta), received as [C][u][L] (delta_recv) and put in place by finish_dout.
struct HeadPipeline::DoutStage {
  TensorBuffer dout, delta, delta_recv;
};

// The fp32 sums of one round's dk and dv (S, w, D) over its stages.
struct HeadPipeline::RoundGrads {
  TensorBuffer dk, dv;
};

// The gradients dx is formed from, kept in sequence layout: each stage's dq ([C][L][u][D], RoPE
// and the q norm undone) and each round's dk and dv ([C][L][w][D]); on the device, or copied to
// `host` (TiledGrad::host).
struct HeadPipeline::DxStash {
  Device& dev;
  Allocator* host = nullptr;
  std::vector<TensorBuffer> q, k, v;
  void keep(std::vector<TensorBuffer>& to, TensorBuffer g, const char* what) {
    if (host == nullptr) {
      to.push_back(std::move(g));
      return;
    }
    TensorBuffer h(*host, g.view().dtype(), g.view().shape(), Tag::kOther, what);
    dev.copy(h.data(), g.data(), g.view().bytes());
    to.push_back(std::move(h));
  }
};

HeadPipeline::DoutStage HeadPipeline::start_dout(int64_t s, const InputRows& dy, const AttentionWeights& w,
                                                 const Tensor& attn_out, const Tensor* delta_all, Exchanges& ex) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, u = sched_.q_per_rank;
  const DType t = cfg_.dtype;
  const int64_t es = dtype_size(t);
  Allocator& alloc = dev_.allocator();
  DoutStage d;
  d.dout = TensorBuffer(alloc, t, {C * L, u, D}, Tag::kCommunication, "dO all-to-all receive");
  d.delta = TensorBuffer(alloc, DType::kF32, {u, C * L}, Tag::kAttnWorkspace, "attention D (head-sharded)");
  TensorBuffer do_send(alloc, t, {C, L, u, D}, Tag::kAttnWorkspace, "dO projection (send layout)");
  // D in send layout [C][u][L]: row j of block p is head slot j's L values.
  TensorBuffer delta_send(alloc, DType::kF32, {C, u, L}, Tag::kAttnWorkspace, "attention D (send layout)");
  d.delta_recv = TensorBuffer(alloc, DType::kF32, {C, u, L}, Tag::kCommunication, "attention D receive");
  const PackedHeads dout = packed(do_send.data(), u);
  const std::vector<std::vector<int64_t>> heads = q_heads_of_blocks(s);
  dy.for_each([&](int64_t r0, int64_t n, const void* dyr) {
    project_blocks(dev_, dout, r0, t, dyr, dy.dtype(), n, w.wo, heads, HeadWeights::kCols);
  });
  // delta_send[p][j][i] = O[i, h(s, p, j)] . dO_send[p][i][j], or the row of delta_all for that head
  for (int64_t p = 0; p < C; ++p)
    for (int64_t j = 0; j < u; ++j) {
      float* dst = delta_send.as<float>() + (p * u + j) * L;
      const int64_t h = sched_.q_head(s, p, j);
      if (delta_all != nullptr) {
        dev_.copy(dst, delta_all->as<float>() + h * L, L * 4);
      } else {
        const PackedHeads out = packed(attn_out.data(), cfg_.heads);
        row_dot(dev_, L, D, t, out.slot(0, h), out.ld(), dout.slot(p, j), dout.ld(), dst, 1);
      }
    }
  ex.start(std::move(do_send), d.dout.data(), L * u * D * es);
  ex.start(std::move(delta_send), d.delta_recv.data(), L * u * 4);
  return d;
}

void HeadPipeline::finish_dout(DoutStage& d) {
  const int64_t C = sched_.ranks, L = rows_, u = sched_.q_per_rank;
  // delta_recv [src][j][i] -> delta [j][src*L + i] (the kernel's (heads, seq) layout)
  for (int64_t src = 0; src < C; ++src)
    dev_.copy_2d(d.delta.as<float>() + src * L, C * L * 4, d.delta_recv.as<float>() + src * u * L, L * 4, L * 4, u);
  d.delta_recv.reset();
}

TensorBuffer HeadPipeline::start_dq(TensorBuffer dq, Exchanges& ex) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, u = sched_.q_per_rank;
  const DType t = cfg_.dtype;
  TensorBuffer recv(dev_.allocator(), t, {C, L, u, D}, Tag::kCommunication, "dq all-to-all receive");
  ex.start(std::move(dq), recv.data(), L * u * D * dtype_size(t));
  return recv;
}

void HeadPipeline::finish_dq(int64_t s, TensorBuffer& recv, SavedStage& st, const AttentionWeights& w,
                             const InputRows& x, float* dx_acc, DxStash* stash, AttentionGrads& g, QkNorm& qk) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, u = sched_.q_per_rank;
  const DType t = cfg_.dtype;
  rope_blocks(dev_, recv.data(), t, C, L, u, D, cfg_.rope_theta, cfg_.rope_scaling, rank_rows(), Rope::kInverse);
  if (qk.on()) {  // through the per-head q norm
    recv = qk.backward(QkPart::kQ, st.q_norm.pre, st.q_norm.rstd, w.q_norm, recv);
    st.q_norm = SavedQkNorm{};
  }
  // Every query head is in exactly one slot of one stage: its dwq rows are written once.
  const PackedHeads dq_seq = packed(recv.data(), u);
  std::vector<HeadBlock> blocks;
  for (int64_t p = 0; p < C; ++p) {
    blocks.push_back({.g = dq_seq.slot(p, 0), .heads = q_heads(s, p)});
    if (stash == nullptr) heads_input_grad(dev_, dx_acc, dq_seq.slot(p, 0), dq_seq.ld(), t, L, w.wq, blocks.back().heads, D);
  }
  head_weight_grads(dev_, blocks, dq_seq.ld(), t, x, D, g.dwq, Write::kOverwrite);
  head_bias_grads(dev_, blocks, dq_seq.ld(), t, L, D, g.dbq, Write::kOverwrite);
  if (stash != nullptr) stash->keep(stash->q, std::move(recv), "dq (kept for dx, host)");
  recv.reset();
}

void HeadPipeline::return_round_dkv(int64_t round, RoundGrads& acc, SavedRound& rd, const AttentionWeights& w,
                                    const InputRows& x, float* dx_acc, DxStash* stash, AttentionGrads& g, QkNorm& qk) {
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, nkv = sched_.kv_per_rank;
  const DType t = cfg_.dtype;
  Allocator& alloc = dev_.allocator();
  // k's sum goes back through RoPE and the k norm; v's straight into the projection backward.
  struct Part {
    TensorBuffer& sum;
    const Tensor& w;
    const Tensor& dw;
    const Tensor& db;  // empty without qkv_bias
    bool is_k;
    const char* send_what;
    const char* recv_what;
  };
  const Part parts[] = {{acc.dk, w.wk, g.dwk, g.dbk, true, "dk all-to-all send", "dk all-to-all receive"},
                        {acc.dv, w.wv, g.dwv, g.dbv, false, "dv all-to-all send", "dv all-to-all receive"}};
  for (const Part& part : parts) {
    // The sums, RoPE undone (their rows are the whole sequence in order), go back in the block's
    // dtype, as dq does: half the bytes of fp32 for bf16, and every GEMM operand of the
    // projection backward in one dtype.
    if (part.is_k) rope_blocks(dev_, part.sum.data(), DType::kF32, 1, seq_group_, nkv, D, cfg_.rope_theta, cfg_.rope_scaling, group_rows(),
                              Rope::kInverse);
    TensorBuffer send;
    if (t != DType::kF32) {
      send = TensorBuffer(alloc, t, {C * L, nkv, D}, Tag::kCommunication, part.send_what);
      convert(dev_, send.data(), t, part.sum.data(), DType::kF32, C * L * nkv * D);
      part.sum.reset();
    }
    TensorBuffer recv(alloc, t, {C, L, nkv, D}, Tag::kCommunication, part.recv_what);
    exchange(dev_, *ulysses_, (t != DType::kF32 ? send : part.sum).data(), recv.data(), L * nkv * D * dtype_size(t));
    send.reset();
    part.sum.reset();
    const bool through_norm = part.is_k && qk.on();
    TensorBuffer dk_pre;
    if (through_norm) {  // through the per-head k norm
      dk_pre = qk.backward(QkPart::kK, rd.k_norm.pre, rd.k_norm.rstd, w.k_norm, recv);
      rd.k_norm = SavedQkNorm{};
    }
    // A KV head replicated over ranks (G < C) appears in several slots: its dw rows add up.
    const PackedHeads grad = packed((through_norm ? dk_pre : recv).data(), nkv);
    std::vector<HeadBlock> blocks;
    for (int64_t p = 0; p < C; ++p) {
      blocks.push_back({.g = grad.slot(p, 0), .heads = kv_heads(round, p)});
      if (stash == nullptr)
        heads_input_grad(dev_, dx_acc, grad.slot(p, 0), grad.ld(), t, L, part.w, blocks.back().heads, D);
    }
    head_weight_grads(dev_, blocks, grad.ld(), t, x, D, part.dw, Write::kAccumulate);
    head_bias_grads(dev_, blocks, grad.ld(), t, L, D, part.db, Write::kAccumulate);
    if (stash != nullptr)
      stash->keep(part.is_k ? stash->k : stash->v, std::move(through_norm ? dk_pre : recv),
                  part.is_k ? "dk (kept for dx, host)" : "dv (kept for dx, host)");
  }
}

void HeadPipeline::hand_out_dx(const TiledGrad& out, const DxStash& stash, const AttentionWeights& w) {
  const int64_t C = sched_.ranks, L = rows_, E = cfg_.hidden, D = cfg_.head_dim, u = sched_.q_per_rank;
  const int64_t nkv = sched_.kv_per_rank, es = dtype_size(cfg_.dtype), T = std::min(out.tile, L);
  const DType t = cfg_.dtype;
  Allocator& alloc = dev_.allocator();
  TensorBuffer tile(alloc, DType::kF32, {T, E}, Tag::kOther, "dx (tile, fp32)");
  // A stash in host memory: each gradient's rows of the tile fetched to the device first,
  // [C][n][heads][D] (its C blocks of rows, packed as a stash of n rows).
  TensorBuffer q_rows, kv_rows;
  if (stash.host != nullptr) {
    q_rows = TensorBuffer(alloc, t, {C, T, u, D}, Tag::kOther, "dq rows (tile, fetched)");
    kv_rows = TensorBuffer(alloc, t, {C, T, nkv, D}, Tag::kOther, "dk or dv rows (tile, fetched)");
  }
  // The slots of gradient g (heads per rank `heads`) for rows [r0, r0 + n).
  auto rows_of = [&](const TensorBuffer& g, int64_t heads, int64_t r0, int64_t n, const TensorBuffer& fetched) {
    const int64_t row = heads * D * es;
    if (stash.host == nullptr) {
      PackedHeads p = packed(g.data(), heads);
      p.base = static_cast<char*>(p.base) + r0 * row;  // block p's row r0 at slot(p, j); ld and block stride kept
      return p;
    }
    dev_.copy_2d(fetched.data(), n * row, static_cast<const char*>(g.data()) + r0 * row, L * row, n * row, C);
    return PackedHeads{.base = fetched.data(), .rows = n, .heads = heads, .d = D, .elem_bytes = es};
  };
  for (int64_t r0 = 0; r0 < L; r0 += out.tile) {
    const int64_t n = std::min(out.tile, L - r0);
    float* const dx = tile.as<float>();
    dev_.fill_zero(dx, n * E * 4);
    // The stash holds the gradients in backward's order: stage backward_stage(i)'s dq at i, and
    // each round's dk and dv in the order the rounds were left.
    for (int64_t i = 0; i < sched_.stages; ++i) {
      const int64_t s = backward_stage(i);
      const PackedHeads q = rows_of(stash.q[static_cast<size_t>(i)], u, r0, n, q_rows);
      for (int64_t p = 0; p < C; ++p) heads_input_grad(dev_, dx, q.slot(p, 0), q.ld(), t, n, w.wq, q_heads(s, p), D);
      if (!sched_.first_of_round(s)) continue;  // the round is left at its first stage
      const size_t left = static_cast<size_t>(i / sched_.stages_per_round);
      for (auto [part, wt] : {std::pair{&stash.k, &w.wk}, {&stash.v, &w.wv}}) {
        const PackedHeads g = rows_of((*part)[left], nkv, r0, n, kv_rows);
        for (int64_t p = 0; p < C; ++p)
          heads_input_grad(dev_, dx, g.slot(p, 0), g.ld(), t, n, *wt, kv_heads(sched_.round(s), p), D);
      }
    }
    out.consume(r0, n, dx);
  }
}

void HeadPipeline::backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x,
                            const AttentionWeights& w, AttentionSaved& saved) {
  check_tensors(cfg_, rows_, x, w, dy);
  run_backward(&dx, nullptr, g, InputRows(dy), InputRows(x), w, saved);
}

void HeadPipeline::backward(const Tensor& dx, AttentionGrads& g, const Tensor& dy, const TiledInput& x,
                            const AttentionWeights& w, AttentionSaved& saved) {
  check_tensors(cfg_, rows_, dy, w, dy);  // (x has no tensor to check: dy has its shape)
  run_backward(&dx, nullptr, g, InputRows(dy), InputRows(dev_, x, rows_, cfg_.hidden, cfg_.dtype), w, saved);
}

void HeadPipeline::backward(const TiledGrad& dx, AttentionGrads& g, const Tensor& dy, const Tensor& x,
                            const AttentionWeights& w, AttentionSaved& saved) {
  check_tensors(cfg_, rows_, x, w, dy);
  check_grads(cfg_, rows_, dy, g);  // (dx is by tiles: dy has its shape)
  run_backward(nullptr, &dx, g, InputRows(dy), InputRows(x), w, saved);
}

void HeadPipeline::backward(const TiledGrad& dx, AttentionGrads& g, const Tensor& dy, const TiledInput& x,
                            const AttentionWeights& w, AttentionSaved& saved) {
  check_tensors(cfg_, rows_, dy, w, dy);  // (x has no tensor to check: dy has its shape)
  check_grads(cfg_, rows_, dy, g);  // (dx is by tiles: dy has its shape)
  run_backward(nullptr, &dx, g, InputRows(dy), InputRows(dev_, x, rows_, cfg_.hidden, cfg_.dtype), w, saved);
}

void HeadPipeline::backward(const TiledGrad& dx, AttentionGrads& g, const TiledInput& dy, const TiledInput& x,
                            const AttentionWeights& w, AttentionSaved& saved) {
  check_weights(cfg_, w);
  check_grad_weights(cfg_, g);
  run_backward(nullptr, &dx, g, InputRows(dev_, dy, rows_, cfg_.hidden, cfg_.dtype, "d block output (tile, fetched)"),
               InputRows(dev_, x, rows_, cfg_.hidden, cfg_.dtype), w, saved);
}

void HeadPipeline::run_backward(const Tensor* dx_whole, const TiledGrad* tiled, AttentionGrads& g,
                                const InputRows& dy, const InputRows& x, const AttentionWeights& w,
                                AttentionSaved& saved) {
  UNTIED_CHECK((dx_whole == nullptr) != (tiled == nullptr), "attention backward: dx whole or by tiles, not both");
  if (tiled != nullptr)
    UNTIED_CHECK(tiled->tile >= 1 && tiled->consume, "attention backward: a TiledGrad needs tile >= 1 and consume");
  else
    check_grads(cfg_, rows_, *dx_whole, g);
  const int64_t C = sched_.ranks, L = rows_, D = cfg_.head_dim, H = cfg_.heads, E = cfg_.hidden;
  const int64_t u = sched_.q_per_rank, nkv = sched_.kv_per_rank, stages = sched_.stages;
  const DType t = cfg_.dtype;
  Allocator& alloc = dev_.allocator();
  const bool recompute = saving_ == Saving::kRecompute;
  const int64_t rounds = stages / sched_.stages_per_round;
  UNTIED_CHECK(static_cast<int64_t>(saved.stages.size()) == stages && static_cast<int64_t>(saved.rounds.size()) == rounds,
               "attention backward without a matching forward (", saved.stages.size(), " saved stages and ",
               saved.rounds.size(), " rounds, expected ", stages, " and ", rounds, ")");
  mask_ = &saved.mask;

  const int64_t es = dtype_size(t);
  // fn(r0, n, dy rows, attn_out rows (n, H*D)) over dy's runs of rows, each cut to the saved
  // output's tile and that output's rows fetched when it is in host memory.
  const int64_t o_tile = saved.attn_out_host_tile;
  UNTIED_CHECK(o_tile == 0 || cfg_.early_delta, "attention backward: a saved output in host memory needs early_delta");
  TensorBuffer o_rows = saved_output_fetch(saved);
  auto with_output = [&](const std::function<void(int64_t, int64_t, const char*, const char*)>& fn) {
    dy.for_each([&](int64_t r0, int64_t n, const void* dyr) {
      const char* dy_rows = static_cast<const char*>(dyr);
      const int64_t run = o_tile > 0 ? o_tile : n;
      for (int64_t a = 0; a < n; a += run) {
        const int64_t m = std::min(run, n - a);
        fn(r0 + a, m, dy_rows == nullptr ? nullptr : dy_rows + a * E * dtype_size(dy.dtype()),
           saved_output_rows(saved, r0 + a, m, o_rows));
      }
    });
  };
  // dwo (E, H*D) = dy^T attn_out, over those runs of rows: by runs, the sums over them run in fp32
  // (in dwo itself, or in an fp32 scratch rounded into dwo once), as when whole.
  {
    const bool scratch = (dy.tiled() || o_tile > 0) && g.dwo.dtype() != DType::kF32;
    TensorBuffer dwo32;
    if (scratch) dwo32 = TensorBuffer(alloc, DType::kF32, {E, H * D}, Tag::kAttnWorkspace, "dwo fp32 sums (tiles)");
    bool first = true;
    with_output([&](int64_t, int64_t n, const char* dyr, const char* o) {
      gemm(dev_, GemmParams{.trans_a = true, .m = E, .n = H * D, .k = n, .beta = first ? 0.0f : 1.0f, .a = dyr,
                            .lda = E, .a_dtype = dy.dtype(), .b = o, .ldb = H * D, .b_dtype = t,
                            .c = scratch ? dwo32.data() : g.dwo.data(), .ldc = H * D,
                            .c_dtype = scratch ? DType::kF32 : g.dwo.dtype()});
      first = false;
    });
    if (scratch) convert(dev_, g.dwo.data(), g.dwo.dtype(), dwo32.data(), DType::kF32, E * H * D);
  }
  // early_delta: D = rowsum(dO * O) of every head now, the dO of U consecutive heads (as many as
  // a stage's buffers hold) projected at a time, a run of dy's rows at a time, so that the saved
  // output can go before the stages' buffers come.
  TensorBuffer delta_all;
  if (cfg_.early_delta) {
    delta_all = TensorBuffer(alloc, DType::kF32, {H, L}, Tag::kAttnWorkspace, "attention D (every head)");
    const int64_t rows = o_tile > 0 ? std::min(o_tile, dy.max_rows()) : dy.max_rows();
    const int64_t U = sched_.stage_heads;
    TensorBuffer dout_g(alloc, t, {rows, U, D}, Tag::kAttnWorkspace, "dO projection (U heads)");
    with_output([&](int64_t r0, int64_t n, const char* dyr, const char* o) {
      for (int64_t h0 = 0; h0 < H; h0 += U) {
        std::vector<int64_t> heads(static_cast<size_t>(U));
        for (int64_t j = 0; j < U; ++j) heads[static_cast<size_t>(j)] = h0 + j;
        project_out_grad_heads(dev_, dout_g.data(), U * D, t, dyr, dy.dtype(), n, w.wo, heads, D);
        for (int64_t j = 0; j < U; ++j)
          row_dot(dev_, n, D, t, o == nullptr ? nullptr : o + (h0 + j) * D * es, H * D, dout_g.as<char>() + j * D * es,
                  U * D, delta_all.as<float>() + (h0 + j) * L + r0, 1);
      }
    });
    saved.attn_out.reset();
  }
  o_rows.reset();
  // dx accumulates in fp32 (whole), or its gradients are kept for the tiles (stash); dwk/dwv
  // accumulate over KV replicas.
  Buffer dx_acc_buf;
  float* dx_acc = nullptr;
  DxStash stash_buf{.dev = dev_, .host = tiled != nullptr ? tiled->host : nullptr};
  DxStash* const stash = tiled != nullptr ? &stash_buf : nullptr;
  if (dx_whole != nullptr) {
    dx_acc = dx_whole->as<float>();
    if (dx_whole->dtype() != DType::kF32) {
      dx_acc_buf = alloc.allocate(L * E * 4, Tag::kOther, "dx fp32 accumulator");
      dx_acc = dx_acc_buf.as<float>();
    }
    dev_.fill_zero(dx_acc, L * E * 4);
  }
  dev_.fill_zero(g.dwk.data(), g.dwk.bytes());
  dev_.fill_zero(g.dwv.data(), g.dwv.bytes());
  if (cfg_.qkv_bias) {
    dev_.fill_zero(g.dbk.data(), g.dbk.bytes());
    dev_.fill_zero(g.dbv.data(), g.dbv.bytes());
  }

  QkNorm qk(dev_, cfg_, QkGrads::kAccumulate);
  // The stages run last first (backward_stage), so that upipe starts with the last stage's q and
  // its round's k and v, which forward kept: a round is entered at its last stage and left at its
  // first.
  auto enters_round = [&](int64_t s) { return sched_.last_of_round(s); };
  auto leaves_round = [&](int64_t s) { return sched_.first_of_round(s); };
  // Stage s's inputs sent off: recomputed (upipe) q, and a round's k and v, unless kept, and dO
  // with D.
  auto send_inputs = [&](int64_t s, Exchanges& ex) {
    if (recompute) {  // the forward's projections again, keeping the norms' inputs
      if (!saved.stages[s].kept) project_q(w, x, s, saved.stages[s], KeepNorm::kYes, ex);
      SavedRound& rd = saved.rounds[sched_.round(s)];
      if (enters_round(s) && !rd.kept) project_kv(w, x, sched_.round(s), rd, KeepNorm::kYes, ex);
    }
    return start_dout(s, dy, w, saved.attn_out, cfg_.early_delta ? &delta_all.view() : nullptr, ex);
  };
  // Stage s's dq, once back in sequence layout, into dx and dwq; as a round is left, the round's
  // dk and dv sums back the same way. The order of these sums into dx is the stages' order
  // (backward_stage) with or without overlap, so both give the same bits.
  RoundGrads acc;
  TensorBuffer dq_recv;
  auto finish = [&](int64_t s, Exchanges& ex) {
    ex.wait();
    finish_dq(s, dq_recv, saved.stages[s], w, x, dx_acc, stash, g, qk);
    if (leaves_round(s))
      return_round_dkv(sched_.round(s), acc, saved.rounds[sched_.round(s)], w, x, dx_acc, stash, g, qk);
  };
  // With overlap, the next stage's inputs are projected and exchanged, and the previous stage's dq
  // returned, while this stage's attention backward runs (one more stage of inputs is live).
  Exchanges in(dev_, *ulysses_, overlap_), out(dev_, *ulysses_, overlap_);
  DoutStage d = send_inputs(backward_stage(0), in), next;
  for (int64_t i = 0; i < stages; ++i) {
    const int64_t s = backward_stage(i), round = sched_.round(s);
    in.wait();
    finish_dout(d);
    if (i + 1 < stages && overlap_) next = send_inputs(backward_stage(i + 1), in);
    if (i > 0 && overlap_) finish(backward_stage(i - 1), out);
    SavedStage& st = saved.stages[s];
    SavedRound& rd = saved.rounds[round];
    if (enters_round(s)) {
      acc.dk = TensorBuffer(alloc, DType::kF32, {C * L, nkv, D}, Tag::kAttnWorkspace, "dk accumulator (round)");
      acc.dv = TensorBuffer(alloc, DType::kF32, {C * L, nkv, D}, Tag::kAttnWorkspace, "dv accumulator (round)");
      dev_.fill_zero(acc.dk.data(), acc.dk.view().bytes());
      dev_.fill_zero(acc.dv.data(), acc.dv.view().bytes());
    }
    TensorBuffer dq;
    if (ring_ != nullptr) {  // dk, dv of this rank's block, summed over the ring, straight into the round's sums
      dq = TensorBuffer(alloc, t, {C * L, u, D}, Tag::kAttnWorkspace, "dq (head-sharded)");
      ring_->backward(*mask_, dq.data(), acc.dk.as<float>(), acc.dv.as<float>(), st.q.data(), rd.k.data(), rd.v.data(),
                      d.delta.as<float>(), st.lse.as<float>(), d.dout.data());
      d = DoutStage{};
      st.q.reset();
      st.o.reset();
    } else {
      // The kernel's results in fp32: dk and dv added straight into the round's sums, dq its own
      // accumulator (no stage dk/dv, no extra dQ accumulator), then narrowed for the exchange.
      AttentionShape ks = kernel_shape();
      ks.f32_results = true;
      ks.accumulate_dkv = true;
      TensorBuffer dq32(alloc, DType::kF32, {C * L, u, D}, Tag::kAttnWorkspace, "dq (head-sharded, fp32)");
      attention_backward_with_delta(dev_, ks,
                                    {.dq = dq32.data(), .dk = acc.dk.data(), .dv = acc.dv.data(), .q = st.q.data(),
                                     .k = rd.k.data(), .v = rd.v.data(), .delta = d.delta.as<float>(),
                                     .lse = st.lse.as<float>(), .dout = d.dout.data()});
      d = DoutStage{};
      st.q.reset();
      st.o.reset();
      if (t == DType::kF32) {
        dq = std::move(dq32);
      } else {
        dq = TensorBuffer(alloc, t, {C * L, u, D}, Tag::kAttnWorkspace, "dq (head-sharded)");
        convert(dev_, dq.data(), t, dq32.data(), DType::kF32, C * L * u * D);
      }
    }
    if (leaves_round(s)) {  // the round's k and v are done with (its norm inputs stay for dk)
      rd.k.reset();
      rd.v.reset();
    }
    dq_recv = start_dq(std::move(dq), out);
    if (overlap_) {
      d = std::move(next);
    } else {
      finish(s, out);
      if (i + 1 < stages) d = send_inputs(backward_stage(i + 1), in);
    }
  }
  if (overlap_) finish(backward_stage(stages - 1), out);
  if (dx_whole != nullptr && dx_whole->dtype() != DType::kF32)
    convert(dev_, dx_whole->data(), dx_whole->dtype(), dx_acc, DType::kF32, L * E);
  if (tiled != nullptr) {
    saved.reset();  // what the stages kept is done with: only the stash is needed now
    hand_out_dx(*tiled, stash_buf, w);
  }
  qk.store_grads(g);
  mask_ = nullptr;
  saved.reset();
}

}  // namespace untied::attn

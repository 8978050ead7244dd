#include "attention/block_ops.h"

#include <algorithm>
#include <string>

#include "untied/attention/head_schedule.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::attn {

namespace {
void check_one(const Tensor& t, const Shape& shape, DType dtype, const char* what) {
  check_shape(t, shape, what);
  UNTIED_CHECK(t.dtype() == dtype, what, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(dtype),
               " (the block's --dtype)");
  UNTIED_CHECK(t.is_contiguous(), what, " must be contiguous");
}
}  // namespace

// The four projections, the optional q/k norms and the optional q/k/v biases, as weights (prefix
// "") or gradients ("d").
void check_weight_set(const AttentionConfig& c, const Tensor* const (&t)[9], const std::string& prefix) {
  const int64_t E = c.hidden, HD = c.heads * c.head_dim, GD = c.kv_heads * c.head_dim, D = c.head_dim;
  const Shape shapes[9] = {{HD, E}, {GD, E}, {GD, E}, {E, HD}, {D}, {D}, {HD}, {GD}, {GD}};
  const char* names[9] = {"wq (H*D, E)", "wk (G*D, E)", "wv (G*D, E)", "wo (E, H*D)", "q_norm (D)",
                          "k_norm (D)",  "bq (H*D)",    "bk (G*D)",    "bv (G*D)"};
  for (int i = 0; i < 9; ++i) {
    if ((i == 4 || i == 5) && !c.qk_norm) continue;
    if (i >= 6 && !c.qkv_bias) continue;
    check_one(*t[i], shapes[i], c.dtype, (prefix + names[i]).c_str());
  }
}

void check_weights(const AttentionConfig& c, const AttentionWeights& w) {
  check_weight_set(c, {&w.wq, &w.wk, &w.wv, &w.wo, &w.q_norm, &w.k_norm, &w.bq, &w.bk, &w.bv}, "");
}

void check_grad_weights(const AttentionConfig& c, const AttentionGrads& g) {
  check_weight_set(c, {&g.dwq, &g.dwk, &g.dwv, &g.dwo, &g.dq_norm, &g.dk_norm, &g.dbq, &g.dbk, &g.dbv}, "d");
}

void check_tensors(const AttentionConfig& c, int64_t rows, const Tensor& x, const AttentionWeights& w,
                   const Tensor& y_or_dy) {
  check_one(x, {rows, c.hidden}, c.dtype, "x (L, E)");
  check_one(y_or_dy, {rows, c.hidden}, c.dtype, "y/dy (L, E)");
  check_weights(c, w);
}

void check_grads(const AttentionConfig& c, int64_t rows, const Tensor& dx, const AttentionGrads& g) {
  // dx may be f32 in a bf16 block: it is then the fp32 accumulator itself (no extra copy).
  check_one(dx, {rows, c.hidden}, dx.dtype() == DType::kF32 ? DType::kF32 : c.dtype, "dx (L, E)");
  check_grad_weights(c, g);
}

HeadWeights::HeadWeights(Device& dev, const Tensor& w, const std::vector<int64_t>& heads, int64_t d, Side side)
    : dtype_(w.dtype()) {
  UNTIED_CHECK(!heads.empty(), "HeadWeights: no heads");
  const int64_t n = static_cast<int64_t>(heads.size()), es = dtype_size(w.dtype());
  const char* base = static_cast<const char*>(w.data());
  if (side == kRows) {  // w (n_heads*D, E): D rows per head
    const int64_t e = w.dim(1);
    ld_ = e;
    if (consecutive_heads(heads)) {
      data_ = base + heads[0] * d * e * es;
      return;
    }
    copy_ = TensorBuffer(dev.allocator(), w.dtype(), {n * d, e}, Tag::kAttnWorkspace, "weight rows of a block of heads");
    for (int64_t k = 0; k < n; ++k)
      dev.copy(copy_.as<char>() + k * d * e * es, base + heads[static_cast<size_t>(k)] * d * e * es, d * e * es);
  } else {  // wo (E, n_heads*D): D columns per head
    const int64_t e = w.dim(0), hd = w.dim(1);
    if (consecutive_heads(heads)) {
      data_ = base + heads[0] * d * es;
      ld_ = hd;
      return;
    }
    ld_ = n * d;
    copy_ = TensorBuffer(dev.allocator(), w.dtype(), {e, n * d}, Tag::kAttnWorkspace, "wo columns of a block of heads");
    for (int64_t k = 0; k < n; ++k)
      dev.copy_2d(copy_.as<char>() + k * d * es, n * d * es, base + heads[static_cast<size_t>(k)] * d * es, hd * es,
                  d * es, e);
  }
  data_ = copy_.data();
}

void project_heads(Device& dev, void* out, int64_t ld_out, DType out_t, const void* x, DType x_t, int64_t rows,
                   const Tensor& w, const std::vector<int64_t>& heads, int64_t d) {
  const int64_t e = w.dim(1), n = static_cast<int64_t>(heads.size()) * d;
  const HeadWeights wh(dev, w, heads, d, HeadWeights::kRows);
  gemm(dev, GemmParams{.trans_b = true, .m = rows, .n = n, .k = e, .a = x, .lda = e, .a_dtype = x_t, .b = wh.data(),
                       .ldb = wh.ld(), .b_dtype = wh.dtype(), .c = out, .ldc = ld_out, .c_dtype = out_t});
}

void project_out_grad_heads(Device& dev, void* dst, int64_t ld_dst, DType dst_t, const void* dy, DType dy_t,
                            int64_t rows, const Tensor& wo, const std::vector<int64_t>& heads, int64_t d) {
  const int64_t e = wo.dim(0), n = static_cast<int64_t>(heads.size()) * d;
  const HeadWeights wh(dev, wo, heads, d, HeadWeights::kCols);
  gemm(dev, GemmParams{.m = rows, .n = n, .k = e, .a = dy, .lda = e, .a_dtype = dy_t, .b = wh.data(), .ldb = wh.ld(),
                       .b_dtype = wh.dtype(), .c = dst, .ldc = ld_dst, .c_dtype = dst_t});
}

void project_blocks(Device& dev, const PackedHeads& dst, int64_t r0, DType out_t, const void* x, DType x_t, int64_t n,
                    const Tensor& w, const std::vector<std::vector<int64_t>>& heads, HeadWeights::Side side) {
  const int64_t C = static_cast<int64_t>(heads.size()), d = dst.d, es = dst.elem_bytes;
  auto project = [&](void* out, int64_t ld_out, const void* xr, int64_t rows, const std::vector<int64_t>& hs) {
    if (side == HeadWeights::kRows) project_heads(dev, out, ld_out, out_t, xr, x_t, rows, w, hs, d);
    else project_out_grad_heads(dev, out, ld_out, out_t, xr, x_t, rows, w, hs, d);
  };
  if (C == 1) {
    project(dst.slot(0, 0) + r0 * dst.ld() * es, dst.ld(), x, n, heads[0]);
    return;
  }
  std::vector<int64_t> all;
  for (const std::vector<int64_t>& h : heads) all.insert(all.end(), h.begin(), h.end());
  const int64_t block = dst.ld(), wide = C * block, chunk = std::min(n, kProjectionRows);
  const int64_t e = side == HeadWeights::kRows ? w.dim(1) : w.dim(0);
  // Heads that are not consecutive (UPipe's stage: one run of heads per block) are read from w as
  // the GEMM packs them, a head (d rows of w, or d columns of wo) per group of columns, instead of
  // copied together first (U*D*E: 10 MiB a stage for Qwen3-32B heads).
  std::vector<int64_t> offsets;
  if (!consecutive_heads(all) && d % 32 == 0)
    for (int64_t h : all) offsets.push_back(side == HeadWeights::kRows ? h * d * e : h * d);
  auto project_all = [&](void* out, int64_t ld_out, const void* xr, int64_t rows) {
    if (offsets.empty()) {
      project(out, ld_out, xr, rows, all);
      return;
    }
    gemm(dev, GemmParams{.trans_b = side == HeadWeights::kRows, .m = rows, .n = wide, .k = e, .a = xr, .lda = e,
                         .a_dtype = x_t, .b = w.data(), .ldb = w.dim(1), .b_dtype = w.dtype(), .c = out,
                         .ldc = ld_out, .c_dtype = out_t, .b_group_offsets = offsets.data(), .b_group = d});
  };
  TensorBuffer out(dev.allocator(), out_t, {chunk, wide}, Tag::kAttnWorkspace, "projection of every block's heads (rows)");
  for (int64_t a = 0; a < n; a += chunk) {
    const int64_t m = std::min(chunk, n - a);
    project_all(out.data(), wide, x == nullptr ? nullptr : static_cast<const char*>(x) + a * e * dtype_size(x_t), m);
    for (int64_t p = 0; p < C; ++p)
      dev.copy_2d(dst.slot(p, 0) + (r0 + a) * block * es, block * es, out.as<char>() + p * block * es, wide * es,
                  block * es, m);
  }
}

namespace {
// fn(k0, n) over the runs of consecutive heads in `heads`: heads[k0 .. k0 + n) are h, h + 1, ...
void for_each_run(const std::vector<int64_t>& heads, const std::function<void(size_t k0, size_t n)>& fn) {
  for (size_t k0 = 0; k0 < heads.size();) {
    size_t n = 1;
    while (k0 + n < heads.size() && heads[k0 + n] == heads[k0] + static_cast<int64_t>(n)) ++n;
    fn(k0, n);
    k0 += n;
  }
}
}  // namespace

void add_head_biases(Device& dev, const PackedHeads& dst, int64_t r0, int64_t n, DType t, const Tensor& bias,
                     const std::vector<std::vector<int64_t>>& heads) {
  if (bias.ndim() == 0) return;
  const int64_t d = dst.d, bs = dtype_size(bias.dtype());
  for (size_t p = 0; p < heads.size(); ++p)
    for_each_run(heads[p], [&](size_t k0, size_t m) {
      add_bias(dev, dst.slot(static_cast<int64_t>(p), static_cast<int64_t>(k0)) + r0 * dst.ld() * dst.elem_bytes, t,
               dst.ld(), n, static_cast<int64_t>(m) * d,
               static_cast<const char*>(bias.data()) + heads[p][k0] * d * bs, bias.dtype());
    });
}

void head_bias_grads(Device& dev, const std::vector<HeadBlock>& blocks, int64_t ld_g, DType g_t, int64_t rows,
                     int64_t d, const Tensor& db, Write db_write) {
  if (db.ndim() == 0) return;
  const int64_t es = dtype_size(db.dtype()), gs = dtype_size(g_t);
  // A head met again (a KV head replicated over ranks) adds to its first sums.
  std::vector<bool> seen(static_cast<size_t>(db.numel() / d), db_write == Write::kAccumulate);
  for (const HeadBlock& b : blocks)
    for_each_run(b.heads, [&](size_t k0, size_t m) {
      const int64_t h = b.heads[k0];
      // A run accumulates as a whole when its first head was met (runs repeat whole, or not at all).
      const bool add = seen[static_cast<size_t>(h)];
      bias_grad(dev, static_cast<char*>(db.data()) + h * d * es, db.dtype(),
                static_cast<const char*>(b.g) + static_cast<int64_t>(k0) * d * gs, g_t, ld_g, rows,
                static_cast<int64_t>(m) * d, add);
      for (size_t k = 0; k < m; ++k) seen[static_cast<size_t>(h) + k] = true;
    });
}

int64_t InputRows::max_rows() const {
  return tiled_ == nullptr ? whole_->dim(0) : std::min(std::max<int64_t>(tiled_->tile, 1), rows_);
}

void InputRows::for_each(const std::function<void(int64_t r0, int64_t n, const void* x)>& fn) const {
  if (tiled_ == nullptr) {
    fn(0, whole_->dim(0), whole_->data());
    return;
  }
  UNTIED_CHECK(tiled_->tile >= 1 && tiled_->rows, "attention: a tiled input needs tile >= 1 and a rows function");
  const int64_t tile = std::min(tiled_->tile, rows_);
  TensorBuffer buf(dev_->allocator(), t_, {tile, hidden_}, Tag::kAttnWorkspace, what_);
  for (int64_t r0 = 0; r0 < rows_; r0 += tile) {
    const int64_t n = std::min(tile, rows_ - r0);
    tiled_->rows(r0, n, buf.data());
    fn(r0, n, buf.data());
  }
}

TensorBuffer whole_input(Device& dev, const TiledInput& x, int64_t rows, int64_t hidden, DType t) {
  TensorBuffer whole(dev.allocator(), t, {rows, hidden}, Tag::kOther, "block input (whole)");
  UNTIED_CHECK(x.tile >= 1 && x.rows, "attention: a tiled input needs tile >= 1 and a rows function");
  const int64_t es = dtype_size(t);
  for (int64_t r0 = 0; r0 < rows; r0 += x.tile)
    x.rows(r0, std::min(x.tile, rows - r0), whole.data() == nullptr ? nullptr : whole.as<char>() + r0 * hidden * es);
  return whole;
}

void hand_out_whole_output(Device& dev, const TiledOutput& y, int64_t rows, int64_t hidden, DType t,
                           const std::function<void(const Tensor& whole)>& forward) {
  UNTIED_CHECK(y.tile >= 1 && y.consume, "attention forward: a TiledOutput needs tile >= 1 and consume");
  TensorBuffer whole(dev.allocator(), t, {rows, hidden}, Tag::kOther, "attention block output (whole)");
  forward(whole.view());
  const int64_t es = dtype_size(t);
  for (int64_t r0 = 0; r0 < rows; r0 += y.tile)
    y.consume(r0, std::min(y.tile, rows - r0), whole.data() == nullptr ? nullptr : whole.as<char>() + r0 * hidden * es);
}

void hand_out_whole(Device& dev, const TiledGrad& dx, int64_t rows, int64_t hidden,
                    const std::function<void(const Tensor& whole)>& backward) {
  UNTIED_CHECK(dx.tile >= 1 && dx.consume, "attention backward: a TiledGrad needs tile >= 1 and consume");
  TensorBuffer whole(dev.allocator(), DType::kF32, {rows, hidden}, Tag::kOther, "dx (whole, fp32)");
  backward(whole);
  for (int64_t r0 = 0; r0 < rows; r0 += dx.tile)
    dx.consume(r0, std::min(dx.tile, rows - r0), whole.as<float>() == nullptr ? nullptr : whole.as<float>() + r0 * hidden);
}

void heads_input_grad(Device& dev, float* dx, const void* g, int64_t ld_g, DType g_t, int64_t rows, const Tensor& w,
                      const std::vector<int64_t>& heads, int64_t d) {
  const int64_t e = w.dim(1), k = static_cast<int64_t>(heads.size()) * d;
  const HeadWeights wh(dev, w, heads, d, HeadWeights::kRows);
  gemm(dev, GemmParams{.m = rows, .n = e, .k = k, .beta = 1.0f, .a = g, .lda = ld_g, .a_dtype = g_t, .b = wh.data(),
                       .ldb = wh.ld(), .b_dtype = wh.dtype(), .c = dx, .ldc = e});
}

void head_weight_grads(Device& dev, const std::vector<HeadBlock>& blocks, int64_t ld_g, DType g_t, const InputRows& x,
                       int64_t d, const Tensor& dw, Write dw_write) {
  const int64_t e = dw.dim(1), es_dw = dtype_size(dw.dtype()), es_g = dtype_size(g_t);
  const bool tiled = x.tiled();
  // Which blocks go straight into dw, and where the others' sums lie in the scratch (in heads).
  std::vector<bool> direct(blocks.size());
  std::vector<int64_t> offset(blocks.size(), 0);
  int64_t scratch_heads = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const int64_t n = static_cast<int64_t>(blocks[b].heads.size());
    direct[b] = consecutive_heads(blocks[b].heads) && (!tiled || dw.dtype() == DType::kF32);
    if (direct[b]) continue;
    if (tiled) {
      offset[b] = scratch_heads;
      scratch_heads += n;
    } else {
      scratch_heads = std::max(scratch_heads, n);
    }
  }
  TensorBuffer acc;
  if (scratch_heads > 0)
    acc = TensorBuffer(dev.allocator(), DType::kF32, {scratch_heads, d, e}, Tag::kAttnWorkspace,
                       "weight gradient fp32 sums");
  auto sums_of = [&](size_t b) { return acc.as<float>() == nullptr ? nullptr : acc.as<float>() + offset[b] * d * e; };
  // A scratch block's sums into dw, head by head.
  auto write_out = [&](size_t b) {
    const std::vector<int64_t>& heads = blocks[b].heads;
    for (size_t k = 0; k < heads.size(); ++k) {
      char* dst = static_cast<char*>(dw.data()) + heads[k] * d * e * es_dw;
      const float* src = sums_of(b) == nullptr ? nullptr : sums_of(b) + static_cast<int64_t>(k) * d * e;
      if (dw_write == Write::kAccumulate) add_into(dev, dst, dw.dtype(), src, DType::kF32, d * e);
      else convert(dev, dst, dw.dtype(), src, DType::kF32, d * e);
    }
  };
  bool first = true;
  x.for_each([&](int64_t r0, int64_t n, const void* xr) {
    for (size_t b = 0; b < blocks.size(); ++b) {
      const HeadBlock& blk = blocks[b];
      const char* g = static_cast<const char*>(blk.g) + r0 * ld_g * es_g;
      void* c = direct[b] ? static_cast<void*>(static_cast<char*>(dw.data()) + blk.heads[0] * d * e * es_dw)
                          : static_cast<void*>(sums_of(b));
      const bool add = direct[b] ? (!first || dw_write == Write::kAccumulate) : (tiled && !first);
      // dW (n_b*D, E) (+)= g^T (n_b*D, n) x (n, E)
      gemm(dev, GemmParams{.trans_a = true, .m = static_cast<int64_t>(blk.heads.size()) * d, .n = e, .k = n,
                           .beta = add ? 1.0f : 0.0f, .a = g, .lda = ld_g, .a_dtype = g_t, .b = xr, .ldb = e,
                           .b_dtype = x.dtype(), .c = c, .ldc = e,
                           .c_dtype = direct[b] ? dw.dtype() : DType::kF32});
      if (!direct[b] && !tiled) write_out(b);
    }
    first = false;
  });
  if (tiled)
    for (size_t b = 0; b < blocks.size(); ++b)
      if (!direct[b]) write_out(b);
}

void rope_blocks(Device& dev, void* buf, DType t, int64_t blocks, int64_t rows, int64_t heads, int64_t d,
                 double theta, const RopeScaling& scaling, const RowPositions& pos, Rope dir) {
  const int64_t es = dtype_size(t);
  if (pos.table != nullptr) {
    for (int64_t b = 0; b < blocks; ++b) {
      const RopeShape s{.tokens = rows, .heads = heads, .head_dim = d, .theta = theta, .dtype = t, .scaling = scaling};
      void* p = static_cast<char*>(buf) + b * rows * heads * d * es;
      if (dir == Rope::kInverse) rope_backward(dev, s, p, pos.table);
      else rope_forward(dev, s, p, pos.table);
    }
    return;
  }
  for (int64_t b = 0; b < blocks; ++b)
    for (const TokenSegment& seg : *pos.segments) {
      const RopeShape s{.tokens = seg.length, .heads = heads, .head_dim = d, .theta = theta, .dtype = t,
                        .first_position = seg.first_position, .scaling = scaling};
      void* p = static_cast<char*>(buf) + (b * rows + seg.first_row) * heads * d * es;
      if (dir == Rope::kInverse) rope_backward(dev, s, p, nullptr);
      else rope_forward(dev, s, p, nullptr);
    }
}

namespace {
TensorBuffer upload(Device& dev, const std::vector<int64_t>& v, const char* what) {
  TensorBuffer b(dev.allocator(), DType::kI64, {static_cast<int64_t>(v.size())}, Tag::kOther, what);
  if (dev.backed()) dev.copy(b.data(), v.data(), static_cast<int64_t>(v.size()) * 8);
  return b;
}
}  // namespace

void keep_mask(Device& dev, const SequenceMask& mask, const std::vector<TokenSegment>& rows,
               const std::vector<TokenSegment>& group, SavedMask& out) {
  out.mask = mask;
  if (mask.num_docs() <= 1) return;
  if (mask.masks_documents()) out.doc_starts = upload(dev, mask.starts(), "document starts");
  out.rope_rows = upload(dev, mask.rope_positions(rows), "RoPE positions (rank rows)");
  out.rope_group = upload(dev, mask.rope_positions(group), "RoPE positions (group sequence)");
}

AttentionShape masked(AttentionShape s, const SavedMask& m) {
  s.window = m.mask.window();
  if (m.mask.masks_documents()) {
    s.doc_starts = m.doc_starts.as<int64_t>();
    s.num_docs = m.mask.num_docs();
    // Rehearsal: unbacked buffers; the kernels do not run, the shape must still validate.
    if (s.doc_starts == nullptr) s.num_docs = 0;
  }
  return s;
}

void check_mask(const AttentionConfig& cfg, const SequenceMask& mask) {
  UNTIED_CHECK(mask.seq() == cfg.seq, "attention: the sequence mask covers ", mask.seq(),
               " tokens, the block's sequence is ", cfg.seq);
}

void exchange(Device& dev, Communicator& comm, const void* send, void* recv, int64_t block_bytes) {
  if (!dev.backed()) return;
  comm.all_to_all(send, recv, block_bytes);
}

Exchanges::~Exchanges() {
  try {
    wait();
  } catch (...) {  // dropped: the caller that wants the error calls wait()
  }
}

void Exchanges::start(TensorBuffer send, void* recv, int64_t block_bytes) {
  if (!overlap_) return exchange(*dev_, *comm_, send.data(), recv, block_bytes);  // `send` is freed here
  start(static_cast<const void*>(send.data()), recv, block_bytes);
  sends_.push_back(std::move(send));
}

void Exchanges::start(const void* send, void* recv, int64_t block_bytes) {
  if (!overlap_) return exchange(*dev_, *comm_, send, recv, block_bytes);
  pending_.push_back(dev_->backed() ? comm_->all_to_all_start(send, recv, block_bytes) : nullptr);
}

void Exchanges::wait() {
  for (std::unique_ptr<PendingExchange>& p : pending_)
    if (p != nullptr) p->wait();
  pending_.clear();
  sends_.clear();
}

QkNorm::QkNorm(Device& dev, const AttentionConfig& c, QkGrads grads)
    : dev_(dev), on_(c.qk_norm), d_(c.head_dim), eps_(c.norm_eps), t_(c.dtype) {
  if (!on_ || grads == QkGrads::kNone) return;
  dq_ = TensorBuffer(dev.allocator(), DType::kF32, {d_}, Tag::kGradients, "dq_norm fp32 accumulator");
  dk_ = TensorBuffer(dev.allocator(), DType::kF32, {d_}, Tag::kGradients, "dk_norm fp32 accumulator");
  dev.fill_zero(dq_.data(), d_ * 4);
  dev.fill_zero(dk_.data(), d_ * 4);
}

TensorBuffer QkNorm::forward(const Tensor& x, const Tensor& w, TensorBuffer* rstd, const char* what) {
  const int64_t rows = x.numel() / d_;
  TensorBuffer y(dev_.allocator(), t_, x.shape(), Tag::kAttnWorkspace, what);
  *rstd = TensorBuffer(dev_.allocator(), DType::kF32, {rows}, Tag::kAttnWorkspace, "q/k norm rstd");
  rmsnorm_forward(dev_, RmsNormShape{.rows = rows, .dim = d_, .eps = eps_, .dtype = t_, .weight_dtype = t_}, y.data(),
                  rstd->as<float>(), x.data(), w.data());
  return y;
}

TensorBuffer QkNorm::backward(QkPart part, const Tensor& x, const Tensor& rstd, const Tensor& w, const Tensor& dy) {
  const int64_t rows = x.numel() / d_;
  TensorBuffer dx(dev_.allocator(), t_, x.shape(), Tag::kAttnWorkspace, "d pre-norm q/k");
  rmsnorm_backward(dev_, RmsNormShape{.rows = rows, .dim = d_, .eps = eps_, .dtype = t_, .weight_dtype = t_},
                   dx.data(), (part == QkPart::kQ ? dq_ : dk_).as<float>(), x.data(), rstd.as<float>(), w.data(), dy.data());
  return dx;
}

void QkNorm::store_grads(const AttentionGrads& g) {
  if (!on_ || !dev_.backed() || dq_.data() == nullptr) return;
  convert(dev_, g.dq_norm.data(), g.dq_norm.dtype(), dq_.data(), DType::kF32, d_);
  convert(dev_, g.dk_norm.data(), g.dk_norm.dtype(), dk_.data(), DType::kF32, d_);
}

}  // namespace untied::attn

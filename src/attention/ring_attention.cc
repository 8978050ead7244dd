// Zig-zag ring attention: see ring_attention.h.
#include "attention/ring_attention.h"

#include "attention/block_ops.h"

#include <chrono>

#include "untied/core/check.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::attn {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

RingAttention::RingAttention(Device& dev, Communicator& ring, const TokenLayout& layout, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, DType dtype, bool overlap)
    : dev_(dev), ring_(ring), layout_(layout), R_(ring.size()), j_(ring.rank()), sg_(layout.group_tokens()),
      lc_(layout.chunk_tokens()), u_(heads), w_(kv_heads), d_(head_dim), t_(dtype), overlap_(overlap) {
  UNTIED_ASSERT(R_ > 1 && R_ == layout.ring(), "ring attention over ", R_, " ranks with a layout of ring ",
                layout.ring());
}

bool RingAttention::pair_shape(const SavedMask& mask, int qi, int jt, int ki, AttentionShape* s) const {
  const int64_t q_pos = layout_.chunk_position(j_, qi), k_pos = layout_.chunk_position(jt, ki);
  if (!mask.mask.any_visible(q_pos, q_pos + lc_ - 1, k_pos, k_pos + lc_ - 1)) return false;
  *s = masked(AttentionShape{.seq_q = lc_, .seq_k = lc_, .heads = u_, .kv_heads = w_, .head_dim = d_,
                             .q_offset = q_pos, .k_offset = k_pos, .causal = true, .dtype = t_, .f32_results = true},
              mask);
  return true;
}

TensorBuffer RingAttention::pack_kv(const void* k, const void* v, const char* what) {
  const int64_t bytes = sg_ * w_ * d_ * dtype_size(t_);
  TensorBuffer kv(dev_.allocator(), t_, {2, sg_, w_, d_}, Tag::kCommunication, what);
  dev_.copy(kv.data(), k, bytes);
  dev_.copy(kv.as<char>() + bytes, v, bytes);
  return kv;
}

std::unique_ptr<PendingExchange> RingAttention::pass_on(const void* send, void* recv, int64_t bytes) {
  if (!dev_.backed()) return nullptr;  // rehearsal: counted buffers, nothing to move
  stats_.exchanges += 1;
  stats_.bytes_sent += bytes;
  auto p = ring_.sendrecv_start(send, bytes, (j_ + 1) % R_, recv, bytes, (j_ + R_ - 1) % R_);
  if (!overlap_) wait(p);
  return p;
}

void RingAttention::wait(std::unique_ptr<PendingExchange>& p) {
  if (p == nullptr) return;
  const auto start = std::chrono::steady_clock::now();
  p->wait();
  stats_.wait_s += seconds_since(start);
  p.reset();
}

void RingAttention::forward(const SavedMask& mask, void* out, float* lse, const void* q, const void* k, const void* v) {
  Allocator& alloc = dev_.allocator();
  const int64_t es = dtype_size(t_), kv_bytes = 2 * sg_ * w_ * d_ * es;
  TensorBuffer kv[2] = {pack_kv(k, v, "ring K/V block"),
                        TensorBuffer(alloc, t_, {2, sg_, w_, d_}, Tag::kCommunication, "ring K/V block (receive)")};
  // Per q chunk: the fp32 output rows of out32 and the chunk's LSE (u, Lc), merged in place.
  TensorBuffer out32(alloc, DType::kF32, {sg_, u_, d_}, Tag::kAttnWorkspace, "ring attention output (fp32)");
  TensorBuffer lse_c[2] = {TensorBuffer(alloc, DType::kF32, {u_, lc_}, Tag::kAttnWorkspace, "ring LSE (chunk 0)"),
                           TensorBuffer(alloc, DType::kF32, {u_, lc_}, Tag::kAttnWorkspace, "ring LSE (chunk 1)")};
  TensorBuffer part(alloc, DType::kF32, {lc_, u_, d_}, Tag::kAttnWorkspace, "ring partial output (fp32)");
  TensorBuffer part_lse(alloc, DType::kF32, {u_, lc_}, Tag::kAttnWorkspace, "ring partial LSE");
  bool first[2] = {true, true};
  int cur = 0;
  for (int t = 0; t < R_; ++t) {
    const int jt = (j_ - t + R_) % R_;  // the ring rank whose K/V block this step holds
    std::unique_ptr<PendingExchange> next;
    if (t + 1 < R_) next = pass_on(kv[cur].data(), kv[1 - cur].data(), kv_bytes);
    const char* kvp = kv[cur].as<char>();
    const auto compute_start = std::chrono::steady_clock::now();
    for (int qi = 0; qi < 2; ++qi)
      for (int ki = 0; ki < 2; ++ki) {
        AttentionShape s;
        if (!pair_shape(mask, qi, jt, ki, &s)) continue;
        const void* qc = static_cast<const char*>(q) + qi * lc_ * u_ * d_ * es;
        const void* kc = kvp + ki * lc_ * w_ * d_ * es;
        const void* vc = kvp + (sg_ + ki * lc_) * w_ * d_ * es;
        float* acc = out32.as<float>() + qi * lc_ * u_ * d_;
        if (first[qi]) {  // the chunk's first result (its own block, step 0) is the accumulator
          attention_forward(dev_, s, {.out = acc, .lse = lse_c[qi].as<float>(), .q = qc, .k = kc, .v = vc});
          first[qi] = false;
          continue;
        }
        attention_forward(dev_, s, {.out = part.data(), .lse = part_lse.as<float>(), .q = qc, .k = kc, .v = vc});
        attention_merge(dev_, AttentionMergeShape{.rows = lc_, .heads = u_, .head_dim = d_},
                        {.acc = acc, .lse_acc = lse_c[qi].as<float>(), .part = part.as<float>(),
                         .lse_part = part_lse.as<float>()});
      }
    stats_.compute_s += seconds_since(compute_start);
    wait(next);
    cur = 1 - cur;
  }
  convert(dev_, out, t_, out32.data(), DType::kF32, sg_ * u_ * d_);
  for (int qi = 0; qi < 2; ++qi)  // lse (u, Sg): chunk qi is columns [qi*Lc, qi*Lc + Lc)
    dev_.copy_2d(lse + qi * lc_, sg_ * 4, lse_c[qi].data(), lc_ * 4, lc_ * 4, u_);
}

void RingAttention::backward(const SavedMask& mask, void* dq, float* dk_acc, float* dv_acc, const void* q, const void* k, const void* v,
                             const float* delta, const float* lse, const void* dout) {
  Allocator& alloc = dev_.allocator();
  const int64_t es = dtype_size(t_), kvn = sg_ * w_ * d_, kv_bytes = 2 * kvn * es, sums_bytes = 2 * kvn * 4;
  TensorBuffer kv[2] = {pack_kv(k, v, "ring K/V block"),
                        TensorBuffer(alloc, t_, {2, sg_, w_, d_}, Tag::kCommunication, "ring K/V block (receive)")};
  // D and lse of each q chunk, contiguous (u, Lc) as the kernel takes them.
  TensorBuffer delta_c[2], lse_c[2];
  for (int qi = 0; qi < 2; ++qi) {
    delta_c[qi] = TensorBuffer(alloc, DType::kF32, {u_, lc_}, Tag::kAttnWorkspace, "ring D (chunk)");
    lse_c[qi] = TensorBuffer(alloc, DType::kF32, {u_, lc_}, Tag::kAttnWorkspace, "ring LSE (chunk)");
    dev_.copy_2d(delta_c[qi].data(), lc_ * 4, delta + qi * lc_, sg_ * 4, lc_ * 4, u_);
    dev_.copy_2d(lse_c[qi].data(), lc_ * 4, lse + qi * lc_, sg_ * 4, lc_ * 4, u_);
  }
  TensorBuffer dq32(alloc, DType::kF32, {sg_, u_, d_}, Tag::kAttnWorkspace, "ring dq (fp32)");
  dev_.fill_zero(dq32.data(), sg_ * u_ * d_ * 4);
  // The travelling dk/dv sums [dk (Sg, w, D) | dv] of a block, and one step's partial sums.
  TensorBuffer sums[2] = {TensorBuffer(alloc, DType::kF32, {2, sg_, w_, d_}, Tag::kCommunication, "ring dk/dv sums"),
                          TensorBuffer(alloc, DType::kF32, {2, sg_, w_, d_}, Tag::kCommunication,
                                       "ring dk/dv sums (receive)")};
  TensorBuffer step(alloc, DType::kF32, {2, sg_, w_, d_}, Tag::kAttnWorkspace, "ring dk/dv of one step");
  TensorBuffer dq_part(alloc, DType::kF32, {lc_, u_, d_}, Tag::kAttnWorkspace, "ring partial dq");
  TensorBuffer dk_part(alloc, DType::kF32, {lc_, w_, d_}, Tag::kAttnWorkspace, "ring partial dk");
  TensorBuffer dv_part(alloc, DType::kF32, {lc_, w_, d_}, Tag::kAttnWorkspace, "ring partial dv");
  std::unique_ptr<PendingExchange> sums_in;  // the previous rank's sums of the block this step holds
  int cur = 0, held = 0;                     // kv[cur]: this step's block; sums[held]: its sums
  for (int t = 0; t < R_; ++t) {
    const int jt = (j_ - t + R_) % R_;
    std::unique_ptr<PendingExchange> next_kv;
    if (t + 1 < R_) next_kv = pass_on(kv[cur].data(), kv[1 - cur].data(), kv_bytes);
    // Step 0 (this rank's own block) sums straight into the travelling buffer; later steps into
    // `step`, added once the previous rank's sums have arrived.
    float* into = t == 0 ? sums[held].as<float>() : step.as<float>();
    dev_.fill_zero(into, sums_bytes);
    const char* kvp = kv[cur].as<char>();
    const auto compute_start = std::chrono::steady_clock::now();
    for (int qi = 0; qi < 2; ++qi)
      for (int ki = 0; ki < 2; ++ki) {
        AttentionShape s;
        if (!pair_shape(mask, qi, jt, ki, &s)) continue;
        const void* qc = static_cast<const char*>(q) + qi * lc_ * u_ * d_ * es;
        const void* doc = static_cast<const char*>(dout) + qi * lc_ * u_ * d_ * es;
        const void* kc = kvp + ki * lc_ * w_ * d_ * es;
        const void* vc = kvp + (sg_ + ki * lc_) * w_ * d_ * es;
        attention_backward_with_delta(dev_, s,
                                      {.dq = dq_part.data(), .dk = dk_part.data(), .dv = dv_part.data(), .q = qc,
                                       .k = kc, .v = vc, .delta = delta_c[qi].as<float>(),
                                       .lse = lse_c[qi].as<float>(), .dout = doc});
        add_into(dev_, dq32.as<float>() + qi * lc_ * u_ * d_, DType::kF32, dq_part.data(), DType::kF32, lc_ * u_ * d_);
        add_into(dev_, into + ki * lc_ * w_ * d_, DType::kF32, dk_part.data(), DType::kF32, lc_ * w_ * d_);
        add_into(dev_, into + kvn + ki * lc_ * w_ * d_, DType::kF32, dv_part.data(), DType::kF32, lc_ * w_ * d_);
      }
    stats_.compute_s += seconds_since(compute_start);
    if (t > 0) {
      wait(sums_in);
      add_into(dev_, sums[held].data(), DType::kF32, step.data(), DType::kF32, 2 * kvn);
    }
    // This block's sums go on to the next rank (after the last step: to the block's owner); the
    // previous rank's sums for the next block (after the last step: this rank's own) come in.
    sums_in = pass_on(sums[held].data(), sums[1 - held].data(), sums_bytes);
    held = 1 - held;
    wait(next_kv);
    cur = 1 - cur;
  }
  wait(sums_in);  // sums[held]: this rank's block, summed over the whole ring
  add_into(dev_, dk_acc, DType::kF32, sums[held].data(), DType::kF32, kvn);
  add_into(dev_, dv_acc, DType::kF32, sums[held].as<float>() + kvn, DType::kF32, kvn);
  convert(dev_, dq, t_, dq32.data(), DType::kF32, sg_ * u_ * d_);
}

}  // namespace untied::attn

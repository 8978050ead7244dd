// The fused, chunked LM head + cross-entropy on the CPU (lm_head_loss.h).
//
// Per chunk of n token rows: the logits (n, V) come from BLAS (untied::gemm, all operands fp32:
// a bf16 h is widened once per chunk, a bf16 w one block of vocab rows at a time, so gemm never
// allocates); then one row-parallel pass turns each row into its max, argmax, exp(logit - max)
// (in place), fp64 sum and log-sum-exp, its loss, and, for the backward, G = grad_scale *
// (softmax - onehot) in place; then dh = G w and dw += G^T h by two more GEMMs per vocab block.
// Rows without a label skip the softmax and get G = 0; a chunk without any label (and no argmax
// asked for) skips the GEMMs and just zeroes its dh rows.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "untied/core/check.h"
#include "untied/kernels/gemm.h"

namespace untied::cpu {
namespace {

constexpr int64_t kLanes = 8;  // fp64 partial sums of a row's exponentials

void check_labels(const LmHeadLossShape& s, const int32_t* labels) {
  for (int64_t t = 0; t < s.tokens; ++t) {
    const int32_t l = labels[t];
    UNTIED_CHECK(l == s.ignore_index || (l >= 0 && l < s.vocab), "lm_head_loss: labels[", t, "] = ", l,
                 " is neither ignore_index (", s.ignore_index, ") nor in [0, vocab = ", s.vocab, ")");
  }
}

// dst (rows, cols) fp32 = src (rows, cols) of storage t, contiguous.
void widen_rows(Device& dev, float* dst, const void* src, DType t, int64_t rows, int64_t cols) {
  const int64_t es = dtype_size(t);
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t r = 0; r < rows; ++r)
    load_f32(dst + r * cols, static_cast<const char*>(src) + r * cols * es, t, cols);
}

// One logits row (V) in place: argmax, and when `labelled`, the exponentials and the loss; for
// `grad`, the row becomes G (0 when not labelled). Returns the row's loss (0 when not labelled).
double row_softmax(float* row, int64_t v, int32_t label, bool labelled, bool grad, float grad_scale,
                   int32_t* argmax) {
  float mx = row[0];
  int64_t am = 0;
  for (int64_t j = 1; j < v; ++j)
    if (row[j] > mx) {
      mx = row[j];
      am = j;
    }
  if (argmax) *argmax = static_cast<int32_t>(am);
  if (!labelled) {
    if (grad) std::fill(row, row + v, 0.0f);
    return 0.0;
  }
  const float target = row[label];
  for (int64_t j = 0; j < v; ++j) row[j] = std::exp(row[j] - mx);
  double lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += row[j + k];
  for (; j < v; ++j) lanes[0] += row[j];
  double sum = 0;
  for (int64_t k = 0; k < kLanes; ++k) sum += lanes[k];
  const double lse = static_cast<double>(mx) + std::log(sum);
  if (grad) {
    const float scale = static_cast<float>(static_cast<double>(grad_scale) / sum);
    for (int64_t k = 0; k < v; ++k) row[k] *= scale;
    row[label] -= grad_scale;
  }
  return lse - static_cast<double>(target);
}

}  // namespace

void lm_head_loss(Device& dev, const LmHeadLossCall& c, const Scratch& ws) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& pass = c.pass;
  const auto& sums = c.sums;
  const auto& argmax = c.argmax;
  const auto& dh = c.dh;
  const auto& dw = c.dw;
  const auto& h = c.h;
  const auto& labels = c.labels;
  const auto& w = c.w;
  const auto& row_losses = c.row_losses;
  const bool backward = pass == LossPass::kForwardBackward;
  const int64_t chunk = lm_head_loss_chunk(s);
  if (chunk == 0) return;  // no tokens
  const int64_t V = s.vocab, E = s.dim;
  const bool h_bf16 = s.dtype != DType::kF32, w_bf16 = s.weight_dtype != DType::kF32;
  check_labels(s, labels);

  // The workspace as lm_head_loss_scratch lays it out (the header's sizes).
  float* logits = ws.as<float>(kLossLogits);
  double* losses = ws.as<double>(kLossRowLosses);
  float* const h32 = ws.as<float>(kLossH32);
  float* const w32 = ws.as<float>(kLossW32);
  const int64_t w_rows = w_bf16 ? lm_head_loss_weight_block(s) : V;  // vocab rows per GEMM
  const int64_t es = dtype_size(s.dtype);
  // Vocab rows [v0, v0 + nb) of w as fp32.
  auto w_block = [&](int64_t v0, int64_t nb) -> const float* {
    if (!w_bf16) return static_cast<const float*>(w) + v0 * E;
    widen_rows(dev, w32, static_cast<const char*>(w) + v0 * E * 2, s.weight_dtype, nb, E);
    return w32;
  };

  for (int64_t t0 = 0; t0 < s.tokens; t0 += chunk) {
    const int64_t n = std::min(chunk, s.tokens - t0);
    const int32_t* lab = labels + t0;
    int64_t labelled = 0;
    for (int64_t i = 0; i < n; ++i) labelled += lab[i] != s.ignore_index;
    char* dh_c = backward ? static_cast<char*>(dh) + t0 * E * es : nullptr;
    if (labelled == 0 && argmax == nullptr) {  // nothing to compute: G = 0
      if (backward) dev.fill_zero(dh_c, n * E * es);
      if (row_losses != nullptr) std::fill(row_losses + t0, row_losses + t0 + n, 0.0);
      continue;
    }

    // logits (n, V) = h_c w^T.
    const float* hc = static_cast<const float*>(h) + t0 * E;
    if (h_bf16) {
      widen_rows(dev, h32, static_cast<const char*>(h) + t0 * E * es, s.dtype, n, E);
      hc = h32;
    }
    for (int64_t v0 = 0; v0 < V; v0 += w_rows) {
      const int64_t nb = std::min(w_rows, V - v0);
      untied::gemm(dev, GemmParams{.trans_b = true, .m = n, .n = nb, .k = E, .a = hc, .lda = E,
                           .b = w_block(v0, nb), .ldb = E, .c = logits + v0, .ldc = V});
    }

    // Row statistics, loss, and G in place.
#pragma omp parallel for schedule(dynamic, 1) num_threads(dev.threads())
    for (int64_t i = 0; i < n; ++i) {
      const bool has = lab[i] != s.ignore_index;
      losses[i] = row_softmax(logits + i * V, V, lab[i], has, backward, s.grad_scale,
                              argmax ? argmax + t0 + i : nullptr);
    }
    for (int64_t i = 0; i < n; ++i) sums->loss_sum += losses[i];  // row order: deterministic
    if (row_losses != nullptr) std::copy(losses, losses + n, row_losses + t0);
    sums->count += labelled;
    if (!backward) continue;

    // dh_c (n, E) = G w;  dw (V, E) += G^T h_c.
    float* dhc = h_bf16 ? ws.as<float>(kLossDh32) : reinterpret_cast<float*>(dh_c);
    for (int64_t v0 = 0; v0 < V; v0 += w_rows) {
      const int64_t nb = std::min(w_rows, V - v0);
      const float* wblk = w_block(v0, nb);
      untied::gemm(dev, GemmParams{.m = n, .n = E, .k = nb, .beta = v0 == 0 ? 0.0f : 1.0f,
                           .a = logits + v0, .lda = V, .b = wblk, .ldb = E, .c = dhc, .ldc = E});
      untied::gemm(dev, GemmParams{.trans_a = true, .m = nb, .n = E, .k = n, .beta = 1.0f,
                           .a = logits + v0, .lda = V, .b = hc, .ldb = E, .c = dw + v0 * E, .ldc = E});
    }
    if (h_bf16) {
#pragma omp parallel for schedule(static) num_threads(dev.threads())
      for (int64_t i = 0; i < n; ++i) store_f32(dh_c + i * E * es, s.dtype, dhc + i * E, E);
    }
  }
}

}  // namespace untied::cpu

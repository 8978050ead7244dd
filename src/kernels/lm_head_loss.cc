#include "untied/kernels/lm_head_loss.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "untied/core/check.h"

namespace untied {

namespace {
constexpr int64_t kDefaultLogitsBytes = int64_t{64} << 20;  // 64 MiB of fp32 logits per chunk
constexpr int64_t kWeightBlockBytes = int64_t{16} << 20;    // one widened block of a bf16 w
}  // namespace

void validate(const LmHeadLossShape& s) {
  UNTIED_CHECK(s.tokens >= 0, "lm_head_loss: tokens must be >= 0, got ", s.tokens);
  UNTIED_CHECK(s.dim >= 1, "lm_head_loss: dim (E) must be >= 1, got ", s.dim);
  UNTIED_CHECK(s.vocab >= 1, "lm_head_loss: vocab must be >= 1, got ", s.vocab);
  UNTIED_CHECK(s.vocab <= (int64_t{1} << 31) - 1, "lm_head_loss: vocab (", s.vocab,
               ") must fit int32 labels");
  UNTIED_CHECK(s.chunk_tokens >= 0, "lm_head_loss: chunk_tokens must be >= 0 (0 = default), got ",
               s.chunk_tokens);
  UNTIED_CHECK(s.ignore_index < 0 || s.ignore_index >= s.vocab, "lm_head_loss: ignore_index (",
               s.ignore_index, ") must not be a valid class in [0, vocab = ", s.vocab, ")");
  UNTIED_CHECK(std::isfinite(s.grad_scale), "lm_head_loss: grad_scale must be finite, got ", s.grad_scale);
  UNTIED_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16,
               "lm_head_loss: dtype (storage of h, dh) must be f32 or bf16, got ", dtype_name(s.dtype));
  UNTIED_CHECK(s.weight_dtype == DType::kF32 || s.weight_dtype == DType::kBF16,
               "lm_head_loss: weight_dtype must be f32 or bf16, got ", dtype_name(s.weight_dtype));
}

int64_t lm_head_loss_chunk(const LmHeadLossShape& s) {
  const int64_t n = s.chunk_tokens > 0 ? s.chunk_tokens
                                       : std::max<int64_t>(1, kDefaultLogitsBytes / (4 * s.vocab));
  return std::min(n, s.tokens);
}

// The vocab rows of one widened block of a bf16 w (lm_head_loss.h).
int64_t lm_head_loss_weight_block(const LmHeadLossShape& s) {
  return std::clamp<int64_t>(kWeightBlockBytes / (4 * s.dim), 1, s.vocab);
}

ScratchRequest lm_head_loss_scratch(const Device&, const LmHeadLossCall& c) {
  const LmHeadLossShape& s = c.s;
  const int64_t chunk = lm_head_loss_chunk(s), V = s.vocab, E = s.dim;
  const bool h_bf16 = s.dtype != DType::kF32, w_bf16 = s.weight_dtype != DType::kF32;
  ScratchRequest r;
  if (chunk == 0) return r;  // no tokens
  r.set(kLossLogits, chunk * V * 4, Tag::kOther, "lm head logits chunk");
  r.set(kLossRowLosses, chunk * 8, Tag::kOther, "lm head row losses");
  if (h_bf16) r.set(kLossH32, chunk * E * 4, Tag::kOther, "lm head h chunk in fp32");
  if (h_bf16 && c.pass == LossPass::kForwardBackward)
    r.set(kLossDh32, chunk * E * 4, Tag::kOther, "lm head dh chunk in fp32");
  if (w_bf16) r.set(kLossW32, lm_head_loss_weight_block(s) * E * 4, Tag::kOther, "lm head w block in fp32");
  return r;
}

int64_t lm_head_loss_workspace_bytes(const LmHeadLossShape& s, bool backward) {
  const int64_t n = lm_head_loss_chunk(s);
  if (n == 0) return 0;
  int64_t bytes = n * s.vocab * 4 + n * 8;
  if (s.dtype == DType::kBF16) bytes += n * s.dim * 4 * (backward ? 2 : 1);
  if (s.weight_dtype == DType::kBF16) bytes += lm_head_loss_weight_block(s) * s.dim * 4;
  return bytes;
}

void lm_head_loss_forward_backward(Device& dev, const LmHeadLossShape& s, LossSums* sums,
                                   int32_t* argmax, void* dh, float* dw, const void* h,
                                   const int32_t* labels, const void* w) {
  validate(s);
  UNTIED_CHECK(sums != nullptr, "lm_head_loss: sums must not be null");
  run_op(dev, &KernelTable::lm_head_loss, "lm_head_loss",
         LmHeadLossCall{.s = s, .pass = LossPass::kForwardBackward, .sums = sums, .argmax = argmax, .dh = dh,
                        .dw = dw, .h = h, .labels = labels, .w = w});
}

void lm_head_loss_forward(Device& dev, const LmHeadLossShape& s, LossSums* sums, int32_t* argmax,
                          const void* h, const int32_t* labels, const void* w, double* row_losses) {
  validate(s);
  UNTIED_CHECK(sums != nullptr, "lm_head_loss: sums must not be null");
  run_op(dev, &KernelTable::lm_head_loss, "lm_head_loss",
         LmHeadLossCall{.s = s, .pass = LossPass::kForward, .sums = sums, .argmax = argmax, .dh = nullptr,
                        .dw = nullptr, .h = h, .labels = labels, .w = w, .row_losses = row_losses});
}

}  // namespace untied

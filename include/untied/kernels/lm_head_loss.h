// The loss op: LM head + softmax cross-entropy, fused and chunked over tokens, so that the
// (tokens, V) logits never exist at once. One call does forward AND backward.
//
// For each chunk of `chunk_tokens` rows of h (the last chunk may be shorter):
//   logits (n, V) fp32 = h_c w^T                          (untied::gemm; w is (V, E), HF layout)
//   lse_i = max_i + log(sum_j exp(logit_ij - max_i))      (exp in fp32, the sum and log in fp64)
//   sums.loss_sum += sum over labelled rows of (lse_i - logit_i[label_i])   (fp64, rows in order)
//   sums.count    += number of labelled rows
//   argmax_i = the first index of the largest logit (every row, labelled or not; if non-null)
// and, in lm_head_loss_forward_backward, with G = grad_scale * (softmax - onehot(label)) and
// G = 0 on ignored rows:
//   dh_c (n, E) = G w               (overwritten; ignored rows get exactly 0)
//   dw (V, E) fp32 += G^T h_c       (ACCUMULATED over chunks, calls and ranks' micro-batches;
//                                     the caller zeroes dw once per step)
// The caller passes grad_scale = 1 / (labelled tokens over all ranks and micro-batches), so that
// the gradients are those of the mean loss; loss_sum and count are returned unscaled and
// ACCUMULATED (+=) into *sums, so the caller zeroes *sums and divides at the end.
// A label is either ignore_index (no target at that position) or in [0, V); anything else is
// Error(kInvalidArgument) naming the label and its position, raised before anything is written.
// In rehearsal (!dev.backed()) labels are not read.
//
// Storage: h, dh in `dtype` (f32 or bf16); w in `weight_dtype` (f32 or bf16); compute fp32.
// Rows are contiguous: h, dh (tokens, E), w, dw (V, E).
//
// Workspace (lm_head_loss_workspace_bytes; all tag Tag::kOther, the tag of kernel scratch that
// is not attention's; live only during the call), with n = the chunk size actually used:
//   logits  n * V * 4                (the chunk's logits, then G in place)
//   losses  n * 8                    (per-row losses, summed in row order: deterministic)
//   h32     n * E * 4   if h is bf16 (the chunk widened once, reused by both GEMMs)
//   dh32    n * E * 4   if dh is bf16 and backward (fp32 accumulator, rounded once into dh)
//   w32     b * E * 4   if w is bf16 (one block of b vocab rows widened at a time, b = the
//                        largest with b * E * 4 <= 16 MiB, at least 1, at most V)
// It does not depend on `tokens` once tokens >= the chunk size, so the loss's peak memory is
// chunk-bounded whatever the sequence length.
// Default chunk (chunk_tokens = 0): the largest n with n * V * 4 <= 64 MiB (at least 1); the
// chunk used is min(that or chunk_tokens, tokens).
//
// Thread safety: one Device, one thread (the kernels fan out to dev.threads()).
// REQUIRES: tokens >= 0, dim >= 1, vocab >= 1, chunk_tokens >= 0; outputs do not overlap inputs.
#pragma once

#include <cstdint>

#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

struct LmHeadLossShape {
  int64_t tokens = 0;                // rows of h (L on one rank)
  int64_t dim = 0;                   // E
  int64_t vocab = 0;                 // V
  int64_t chunk_tokens = 0;          // rows per chunk; 0 = the default (64 MiB of logits)
  int32_t ignore_index = -100;       // label of positions without a target
  float grad_scale = 1.0f;           // multiplies G (forward_backward only)
  DType dtype = DType::kF32;         // storage of h, dh
  DType weight_dtype = DType::kF32;  // storage of w
};

// What the loss returns; both fields are accumulated (+=) by the kernels.
struct LossSums {
  double loss_sum = 0;  // sum over labelled rows of -log softmax(logits)[label]
  int64_t count = 0;    // labelled rows
};

// Throws Error(kInvalidArgument) naming the bad field.
void validate(const LmHeadLossShape& s);

// The chunk size a call with this shape uses (>= 1 when tokens >= 1; 0 when tokens == 0).
int64_t lm_head_loss_chunk(const LmHeadLossShape& s);
// The workspace bytes a call allocates (see above), for the memory planner.
int64_t lm_head_loss_workspace_bytes(const LmHeadLossShape& s, bool backward);

// *sums +=, argmax (tokens) int32 = (nullable), dh (tokens, E) =, dw (V, E) fp32 +=,
// from h (tokens, E), labels (tokens) int32 and the LM head w (V, E).
void lm_head_loss_forward_backward(Device& dev, const LmHeadLossShape& s, LossSums* sums,
                                   int32_t* argmax, void* dh, float* dw, const void* h,
                                   const int32_t* labels, const void* w);

// Evaluation: *sums +=, argmax (tokens) int32 = (nullable); no gradients (grad_scale unused).
// row_losses (host memory, nullable): (tokens) = each row's loss, 0 where the row is unlabelled.
void lm_head_loss_forward(Device& dev, const LmHeadLossShape& s, LossSums* sums, int32_t* argmax,
                          const void* h, const int32_t* labels, const void* w, double* row_losses = nullptr);

}  // namespace untied

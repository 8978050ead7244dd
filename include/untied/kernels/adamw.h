// AdamW (decoupled weight decay, Loshchilov & Hutter; PyTorch's torch.optim.AdamW formula) and
// the two helpers of global-norm gradient clipping.
//
// One step over n fp32 elements, in place on p, m, v, from the gradient g, with t = step:
//   p <- p - lr * weight_decay * p                 (only when decay is true)
//   m <- beta1 m + (1 - beta1) g
//   v <- beta2 v + (1 - beta2) g^2
//   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The bias corrections are computed in fp64 once per call; the element update is fp32.
// The caller decides decay per parameter tensor (norm weights and embeddings typically false).
// Elements are independent: the result does not depend on the thread count.
//
// Clipping: grad_sum_squares(g) returns sum g_i^2 accumulated in fp64 over fixed blocks of
// elements summed in order (deterministic, thread-count independent); the trainer adds the
// ranks' sums, takes the square root and, when it exceeds the limit, calls scale_in_place.
//
// Workspace: grad_sum_squares allocates ceil(n / 65536) fp64 block sums (Tag::kOther) for the
// duration of the call; adamw_step and scale_in_place none. In rehearsal (!dev.backed()) nothing
// is read or written and grad_sum_squares returns 0.
// REQUIRES: n >= 0; step >= 1; 0 <= beta1, beta2 < 1; eps > 0; lr >= 0; weight_decay >= 0;
//           p, m, v, g do not overlap.
#pragma once

#include <cstdint>

#include "untied/device/device.h"

namespace untied {

struct AdamWParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;    // 1-based: the first update is step 1
  bool decay = true;   // apply weight_decay to this tensor
};

// Throws Error(kInvalidArgument) naming the bad field.
void validate(const AdamWParams& a);

// p, m, v (n) fp32 updated in place (=) from g (n) fp32.
void adamw_step(Device& dev, float* p, float* m, float* v, const float* g, int64_t n,
                const AdamWParams& a);

// Returns sum_i g_i^2 over g (n) fp32, accumulated in fp64.
double grad_sum_squares(Device& dev, const float* g, int64_t n);

// x (n) fp32 *= scale, in place.
void scale_in_place(Device& dev, float* x, int64_t n, float scale);

}  // namespace untied

// CPU implementations of the model kernels declared in include/untied/kernels/{rmsnorm,swiglu,
// embedding,lm_head_loss,adamw}.h. The public entry points (src/kernels/<op>.cc) validate their
// arguments and dispatch here on Device::kind(); these functions assume a validated shape.
// Data-dependent checks (ids, labels) are done here, before anything is written, since only
// the backend can read the data.
#pragma once

#include <cstdint>

#include "untied/core/allocator.h"
#include "untied/kernels/adamw.h"
#include "untied/kernels/embedding.h"
#include "untied/kernels/lm_head_loss.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/kernels/swiglu.h"

namespace untied {
// Vocab rows per widened block of a bf16 LM head (src/kernels/lm_head_loss.cc; lm_head_loss.h).
int64_t lm_head_loss_weight_block(const LmHeadLossShape& s);

// The loss's workspace exactly as lm_head_loss.h lays it out, for a chunk of `chunk` rows: every
// backend allocates this (so rehearsal and the memory figures do not depend on the backend).
// h32/dh32/w32 are empty unless h / h in backward / w are bf16; w_block = vocab rows per GEMM.
struct LmHeadLossWorkspace {
  int64_t w_block = 0;
  Buffer logits, losses, h32, dh32, w32;
};
LmHeadLossWorkspace allocate_lm_head_loss_workspace(Device& dev, const LmHeadLossShape& s, int64_t chunk,
                                                    bool backward);
}  // namespace untied

namespace untied::cpu {

void rmsnorm_forward(Device& dev, const RmsNormShape& s, void* y, float* rstd, const void* x,
                     const void* w);
void rmsnorm_backward(Device& dev, const RmsNormShape& s, void* dx, float* dw, const void* x,
                      const float* rstd, const void* w, const void* dy);

void swiglu_forward(Device& dev, const SwigluShape& s, void* out, const void* gate, const void* up);
void swiglu_backward(Device& dev, const SwigluShape& s, void* dgate, void* dup, const void* gate,
                     const void* up, const void* dout);

void embedding_forward(Device& dev, const EmbeddingShape& s, void* out, const int32_t* ids,
                       const void* table);
void embedding_backward(Device& dev, const EmbeddingShape& s, float* dtable, const int32_t* ids,
                        const void* dout);

// backward = false: forward only (dh and dw unused). Not inferred from the pointers, which are
// null in rehearsal.
void lm_head_loss(Device& dev, const LmHeadLossShape& s, bool backward, LossSums* sums,
                  int32_t* argmax, void* dh, float* dw, const void* h, const int32_t* labels,
                  const void* w);

void adamw_step(Device& dev, float* p, float* m, float* v, const float* g, int64_t n,
                const AdamWParams& a);
double grad_sum_squares(Device& dev, const float* g, int64_t n);
void scale_in_place(Device& dev, float* x, int64_t n, float scale);

}  // namespace untied::cpu

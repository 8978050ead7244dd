// CPU implementations of the kernels declared in include/untied/kernels/*.h. The public entry
// points (src/kernels/*.cc) validate their arguments and dispatch here on Device::kind().
#pragma once

#include "untied/kernels/attention.h"
#include "untied/kernels/gemm.h"
#include "untied/kernels/rope.h"

namespace untied::cpu {

void gemm(Device& dev, const GemmParams& p);
void attention_forward(Device& dev, const AttentionShape& s, void* out, float* lse, const void* q,
                       const void* k, const void* v);
// Reads `out` when `delta` is null, else *delta (the caller's D; *delta may be null in rehearsal).
void attention_backward(Device& dev, const AttentionShape& s, void* dq, void* dk, void* dv,
                        const void* q, const void* k, const void* v, const void* out,
                        const float* const* delta, const float* lse, const void* dout);
void rope_apply(Device& dev, const RopeShape& s, void* x, const int64_t* positions, bool inverse);

}  // namespace untied::cpu

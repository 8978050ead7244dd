// CPU implementations of the kernels declared in include/untied/kernels/*.h. The public entry
// points (src/kernels/*.cc) validate their arguments and dispatch here on Device::kind().
#pragma once

#include "untied/kernels/attention.h"
#include "untied/kernels/gemm.h"
#include "untied/kernels/rope.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::cpu {

void gemm(Device& dev, const GemmParams& p);
void attention_forward(Device& dev, const AttentionShape& s, void* out, float* lse, const void* q,
                       const void* k, const void* v);
// Reads `out` when `delta` is null, else *delta (the caller's D; *delta may be null in rehearsal).
void attention_backward(Device& dev, const AttentionShape& s, void* dq, void* dk, void* dv,
                        const void* q, const void* k, const void* v, const void* out,
                        const float* const* delta, const float* lse, const void* dout);
void rope_apply(Device& dev, const RopeShape& s, void* x, const int64_t* positions, bool inverse);

void row_dot(Device& dev, int64_t rows, int64_t dim, DType t, const void* a, int64_t lda, const void* b, int64_t ldb,
             float* out, int64_t out_stride);
void add_into(Device& dev, void* acc, DType acc_t, const void* x, DType x_t, int64_t n);
void convert(Device& dev, void* dst, DType dst_t, const void* src, DType src_t, int64_t n);

}  // namespace untied::cpu

// CUDA implementations of the kernels in include/untied/kernels/*.h, one file pair per op in
// src/kernels/cuda/ (built with the CUDA backend; a build without it has only
// no_cuda_kernels.cc, unreachable because no CUDA Device can be made there). The public entry
// points validate their arguments and dispatch here on Device::kind() == kCuda.
//
// Conventions for every function here:
//   - Every tensor pointer is GPU memory of `dev` (allocated from its allocator); the only host
//     pointers are LossSums* (lm_head_loss) and the returned doubles.
//   - Work is issued on the device's stream (static_cast<CudaDevice&>(dev).stream()) and is
//     asynchronous unless a result must come back to the host (grad_sum_squares, lm_head_loss's
//     sums, data checks of ids and labels), which synchronizes that stream.
//   - Every launch is checked (UNTIED_CUDA_CHECK(cudaGetLastError()) after it).
//   - Scratch comes from dev.allocator() with the tags the public headers name, so the memory
//     figures are the same as on the CPU.
//   - Results match the CPU kernels to fp32 rounding (different summation orders); where the
//     CPU header promises thread-count independence, the CUDA result is run-to-run deterministic,
//     except attention's dq (fp32 atomics; see attention.h).
//   - Scratch freed at the end of a call may still be in use by queued kernels: the caching
//     allocator hands it out again only to this device's stream (ordered after them) or to a
//     communicator whose stream waits for that stream first.
#pragma once

#include "untied/kernels/adamw.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/embedding.h"
#include "untied/kernels/gemm.h"
#include "untied/kernels/lm_head_loss.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/kernels/rope.h"
#include "untied/kernels/swiglu.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::cuda {

void gemm(Device& dev, const GemmParams& p);  // gemm.cc

// attention.cu. Backward: delta (H, seq_q) fp32 given, or null and then computed from out.
void attention_forward(Device& dev, const AttentionShape& s, void* out, float* lse, const void* q,
                       const void* k, const void* v);
void attention_backward(Device& dev, const AttentionShape& s, void* dq, void* dk, void* dv,
                        const void* q, const void* k, const void* v, const void* out,
                        const float* delta, const float* lse, const void* dout);

void rope_apply(Device& dev, const RopeShape& s, void* x, const int64_t* positions, bool inverse);  // rope.cu

void rmsnorm_forward(Device& dev, const RmsNormShape& s, void* y, float* rstd, const void* x,
                     const void* w);  // rmsnorm.cu
void rmsnorm_backward(Device& dev, const RmsNormShape& s, void* dx, float* dw, const void* x,
                      const float* rstd, const void* w, const void* dy);

void swiglu_forward(Device& dev, const SwigluShape& s, void* out, const void* gate, const void* up);  // swiglu.cu
void swiglu_backward(Device& dev, const SwigluShape& s, void* dgate, void* dup, const void* gate,
                     const void* up, const void* dout);

void embedding_forward(Device& dev, const EmbeddingShape& s, void* out, const int32_t* ids,
                       const void* table);  // embedding.cu
void embedding_backward(Device& dev, const EmbeddingShape& s, float* dtable, const int32_t* ids,
                        const void* dout);

// lm_head_loss.cu; backward = false: forward only (dh and dw unused).
void lm_head_loss(Device& dev, const LmHeadLossShape& s, bool backward, LossSums* sums, int32_t* argmax,
                  void* dh, float* dw, const void* h, const int32_t* labels, const void* w);

void adamw_step(Device& dev, float* p, float* m, float* v, const float* g, int64_t n,
                const AdamWParams& a);  // adamw.cu
double grad_sum_squares(Device& dev, const float* g, int64_t n);
void scale_in_place(Device& dev, float* x, int64_t n, float scale);

void row_dot(Device& dev, int64_t rows, int64_t dim, DType t, const void* a, int64_t lda, const void* b, int64_t ldb,
             float* out, int64_t out_stride);  // tensor_ops.cu
void add_into(Device& dev, void* acc, DType acc_t, const void* x, DType x_t, int64_t n);
void convert(Device& dev, void* dst, DType dst_t, const void* src, DType src_t, int64_t n);

}  // namespace untied::cuda

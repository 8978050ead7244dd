// The CUDA kernels, one file per op in src/backends/cuda/ (built with the CUDA backend), listed in
// one table (cuda_backend.cc). Each takes its op's call struct (kernels/backend.h), already
// checked by the entry point (with the refusals of the *_supports functions here), and the
// scratch its *_scratch function asked for.
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

#include "kernels/backend.h"

namespace untied::cuda {

void gemm(Device& dev, const GemmParams& p, const Scratch& scratch);  // gemm.cc (cuBLAS)
Status gemm_supports(const GemmParams& p);
// Every group in one cublasGemmGroupedBatchedEx (its device arrays of pointers in the scratch);
// the groups one by one through cublasGemmEx where this cuBLAS lacks the call.
void gemm_grouped(Device& dev, const GemmGroupedCall& c, const Scratch& scratch);
ScratchRequest gemm_grouped_scratch(const Device& dev, const GemmGroupedCall& c);
Status gemm_grouped_supports(const GemmGroupedCall& c);

// attention_forward.cu, attention_backward.cu
void attention_forward(Device& dev, const AttentionForwardCall& c, const Scratch& scratch);
Status attention_forward_supports(const AttentionForwardCall& c);
void attention_backward(Device& dev, const AttentionBackwardCall& c, const Scratch& scratch);
ScratchRequest attention_backward_scratch(const Device& dev, const AttentionBackwardCall& c);
Status attention_backward_supports(const AttentionBackwardCall& c);

void attention_merge(Device& dev, const AttentionMergeCall& c, const Scratch& scratch);  // attention_forward.cu

// UNTIED_CUDA_ATTENTION (attention_select.h): true for "wgmma" (the Hopper attention kernels
// where they can run), false for auto, cudnn and mma; any other value is refused, saying what to
// write (make_cuda_device refuses it on every rank before any compute).
StatusOr<bool> attention_wgmma_requested();
// One line: which attention kernels run and why (cuda_attention_description, device/cuda.h).
std::string attention_description();

void rope(Device& dev, const RopeCall& c, const Scratch& scratch);  // rope.cu
Status rope_supports(const RopeCall& c);

void rmsnorm_forward(Device& dev, const RmsNormForwardCall& c, const Scratch& scratch);  // rmsnorm.cu
void rmsnorm_backward(Device& dev, const RmsNormBackwardCall& c, const Scratch& scratch);
void swiglu_forward(Device& dev, const SwigluForwardCall& c, const Scratch& scratch);  // swiglu.cu
void swiglu_backward(Device& dev, const SwigluBackwardCall& c, const Scratch& scratch);

// embedding.cu
void embedding_forward(Device& dev, const EmbeddingForwardCall& c, const Scratch& scratch);
ScratchRequest embedding_forward_scratch(const Device& dev, const EmbeddingForwardCall& c);
void embedding_backward(Device& dev, const EmbeddingBackwardCall& c, const Scratch& scratch);
ScratchRequest embedding_backward_scratch(const Device& dev, const EmbeddingBackwardCall& c);
Status embedding_backward_supports(const EmbeddingBackwardCall& c);

void lm_head_loss(Device& dev, const LmHeadLossCall& c, const Scratch& scratch);  // lm_head_loss.cu

// adamw.cu
void adamw_step(Device& dev, const AdamWCall& c, const Scratch& scratch);
void grad_sum_squares(Device& dev, const SumSquaresCall& c, const Scratch& scratch);
ScratchRequest grad_sum_squares_scratch(const Device& dev, const SumSquaresCall& c);
Status grad_sum_squares_supports(const SumSquaresCall& c);
void scale_in_place(Device& dev, const ScaleCall& c, const Scratch& scratch);

// tensor_ops.cu
void row_dot(Device& dev, const RowDotCall& c, const Scratch& scratch);
void add_into(Device& dev, const AddIntoCall& c, const Scratch& scratch);
void convert(Device& dev, const ConvertCall& c, const Scratch& scratch);
void add_bias(Device& dev, const AddBiasCall& c, const Scratch& scratch);
void bias_grad(Device& dev, const BiasGradCall& c, const Scratch& scratch);
ScratchRequest bias_grad_scratch(const Device& dev, const BiasGradCall& c);
void gather_rows(Device& dev, const GatherRowsCall& c, const Scratch& scratch);
void combine_rows(Device& dev, const CombineRowsCall& c, const Scratch& scratch);
void combine_rows_backward(Device& dev, const CombineRowsBackwardCall& c, const Scratch& scratch);

}  // namespace untied::cuda

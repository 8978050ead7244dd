// The CPU kernels, one file per op in src/kernels/cpu/, listed in one table (cpu_backend.cc).
// Each takes its op's call struct (kernels/backend.h), already checked by the entry point, and
// the scratch its *_scratch function asked for; none runs in rehearsal. Data-dependent checks
// (ids, labels) are done here, before anything is written, since only the backend reads data.
// Kernels run on the device's OpenMP threads (dev.threads()). None calls BLAS inside a
// parallel region (the attention's tiles use tile_gemm), so BLAS runs only at the top level,
// on its own threads, and a BLAS with a pthread pool cannot oversubscribe the cores.
#pragma once

#include "kernels/backend.h"

namespace untied::cpu {

void gemm(Device& dev, const GemmParams& p, const Scratch& scratch);
ScratchRequest gemm_scratch(const Device& dev, const GemmParams& p);

void attention_forward(Device& dev, const AttentionForwardCall& c, const Scratch& scratch);
ScratchRequest attention_forward_scratch(const Device& dev, const AttentionForwardCall& c);
void attention_backward(Device& dev, const AttentionBackwardCall& c, const Scratch& scratch);
ScratchRequest attention_backward_scratch(const Device& dev, const AttentionBackwardCall& c);

void attention_merge(Device& dev, const AttentionMergeCall& c, const Scratch& scratch);

void rope(Device& dev, const RopeCall& c, const Scratch& scratch);
ScratchRequest rope_scratch(const Device& dev, const RopeCall& c);

void rmsnorm_forward(Device& dev, const RmsNormForwardCall& c, const Scratch& scratch);
void rmsnorm_backward(Device& dev, const RmsNormBackwardCall& c, const Scratch& scratch);
void swiglu_forward(Device& dev, const SwigluForwardCall& c, const Scratch& scratch);
void swiglu_backward(Device& dev, const SwigluBackwardCall& c, const Scratch& scratch);
void embedding_forward(Device& dev, const EmbeddingForwardCall& c, const Scratch& scratch);
void embedding_backward(Device& dev, const EmbeddingBackwardCall& c, const Scratch& scratch);
void lm_head_loss(Device& dev, const LmHeadLossCall& c, const Scratch& scratch);

void adamw_step(Device& dev, const AdamWCall& c, const Scratch& scratch);
void grad_sum_squares(Device& dev, const SumSquaresCall& c, const Scratch& scratch);
ScratchRequest grad_sum_squares_scratch(const Device& dev, const SumSquaresCall& c);
void scale_in_place(Device& dev, const ScaleCall& c, const Scratch& scratch);

void row_dot(Device& dev, const RowDotCall& c, const Scratch& scratch);
void add_into(Device& dev, const AddIntoCall& c, const Scratch& scratch);
void convert(Device& dev, const ConvertCall& c, const Scratch& scratch);
void add_bias(Device& dev, const AddBiasCall& c, const Scratch& scratch);
void bias_grad(Device& dev, const BiasGradCall& c, const Scratch& scratch);
void gather_rows(Device& dev, const GatherRowsCall& c, const Scratch& scratch);
void combine_rows(Device& dev, const CombineRowsCall& c, const Scratch& scratch);
void combine_rows_backward(Device& dev, const CombineRowsBackwardCall& c, const Scratch& scratch);

}  // namespace untied::cpu

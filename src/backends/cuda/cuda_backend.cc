// The CUDA backend's kernel table: every op, its scratch and its refusals (cuda_kernels.h).
#include "backends/cuda/cuda_kernels.h"

#include "backends/cuda/attention_select.h"
#include "backends/cuda/cudnn_attention.h"

#include <cstdlib>
#include <string>

namespace untied::cuda {

std::string attention_description() {
  const StatusOr<AttentionKernel> k = attention_kernel_requested();
  if (!k.ok()) return k.status().message();
  switch (k.value()) {
    case AttentionKernel::kMma: return "our mma kernels (UNTIED_CUDA_ATTENTION=mma)";
    case AttentionKernel::kWgmma:
      return "the Hopper wgmma kernels where they run, else mma (UNTIED_CUDA_ATTENTION=wgmma)";
    case AttentionKernel::kAuto:
      if (!kAutoTakesCudnn)
        return "our mma kernels (auto: cuDNN's fused attention is taken once a GPU run has checked it; "
               "UNTIED_CUDA_ATTENTION=cudnn takes it now)";
      [[fallthrough]];
    case AttentionKernel::kCudnn: {
      const Status ready = cudnn_attention_ready();
      if (!ready.ok()) return "our mma kernels: " + ready.message();
      return "cuDNN's fused attention where it takes the case (bf16, D 64 or 128, one causal or full sequence), "
             "else our mma kernels";
    }
  }
  return "";
}

StatusOr<bool> attention_wgmma_requested() {
  const StatusOr<AttentionKernel> k = attention_kernel_requested();
  if (!k.ok()) return k.status();
  return k.value() == AttentionKernel::kWgmma;
}

const KernelTable& kernel_table() {
  static const KernelTable table{
      .name = "cuda",
      .gemm = {.run = gemm, .supports = gemm_supports},
      .gemm_grouped = {.run = gemm_grouped, .scratch = gemm_grouped_scratch, .supports = gemm_grouped_supports},
      .attention_forward = {.run = attention_forward, .supports = attention_forward_supports},
      .attention_backward = {.run = attention_backward, .scratch = attention_backward_scratch,
                             .supports = attention_backward_supports},
      .attention_merge = {.run = attention_merge},
      .rope = {.run = rope, .supports = rope_supports},
      .rmsnorm_forward = {.run = rmsnorm_forward},
      .rmsnorm_backward = {.run = rmsnorm_backward, .scratch = rmsnorm_backward_scratch},
      .swiglu_forward = {.run = swiglu_forward},
      .swiglu_backward = {.run = swiglu_backward},
      .embedding_forward = {.run = embedding_forward, .scratch = embedding_forward_scratch},
      .embedding_backward = {.run = embedding_backward, .scratch = embedding_backward_scratch,
                             .supports = embedding_backward_supports},
      .lm_head_loss = {.run = lm_head_loss, .scratch = lm_head_loss_scratch},
      .adamw = {.run = adamw_step},
      .grad_sum_squares = {.run = grad_sum_squares, .scratch = grad_sum_squares_scratch,
                           .supports = grad_sum_squares_supports},
      .scale_in_place = {.run = scale_in_place},
      .row_dot = {.run = row_dot},
      .add_into = {.run = add_into},
      .convert = {.run = convert},
      .add_bias = {.run = add_bias},
      .bias_grad = {.run = bias_grad, .scratch = bias_grad_scratch},
      .gather_rows = {.run = gather_rows},
      .combine_rows = {.run = combine_rows},
      .combine_rows_backward = {.run = combine_rows_backward},
  };
  return table;
}

}  // namespace untied::cuda

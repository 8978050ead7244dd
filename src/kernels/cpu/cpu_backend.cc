// The CPU backend's kernel table: every op, its scratch and (none here) its refusals.
#include "kernels/cpu/cpu_kernels.h"

namespace untied::cpu {

const KernelTable& kernel_table() {
  static const KernelTable table{
      .name = "cpu",
      .gemm = {.run = gemm, .scratch = gemm_scratch},
      .attention_forward = {.run = attention_forward, .scratch = attention_forward_scratch},
      .attention_backward = {.run = attention_backward, .scratch = attention_backward_scratch},
      .attention_merge = {.run = attention_merge},
      .rope = {.run = rope, .scratch = rope_scratch},
      .rmsnorm_forward = {.run = rmsnorm_forward},
      .rmsnorm_backward = {.run = rmsnorm_backward, .scratch = rmsnorm_backward_scratch},
      .swiglu_forward = {.run = swiglu_forward},
      .swiglu_backward = {.run = swiglu_backward},
      .embedding_forward = {.run = embedding_forward},
      .embedding_backward = {.run = embedding_backward},
      .lm_head_loss = {.run = lm_head_loss, .scratch = lm_head_loss_scratch},
      .adamw = {.run = adamw_step},
      .grad_sum_squares = {.run = grad_sum_squares, .scratch = grad_sum_squares_scratch},
      .scale_in_place = {.run = scale_in_place},
      .row_dot = {.run = row_dot},
      .add_into = {.run = add_into},
      .convert = {.run = convert},
      .add_bias = {.run = add_bias},
      .bias_grad = {.run = bias_grad},
      .gather_rows = {.run = gather_rows},
      .combine_rows = {.run = combine_rows},
      .combine_rows_backward = {.run = combine_rows_backward},
  };
  return table;
}

}  // namespace untied::cpu

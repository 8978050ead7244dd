#include "untied/kernels/rope.h"

#include "kernels/backend.h"

namespace untied {

void validate(const RopeShape& s) {
  UNTIED_CHECK(s.tokens >= 0, "rope: tokens must be >= 0, got ", s.tokens);
  UNTIED_CHECK(s.heads >= 1, "rope: heads must be >= 1, got ", s.heads);
  UNTIED_CHECK(s.head_dim >= 2 && s.head_dim % 2 == 0 && s.head_dim <= 2048,
               "rope: head_dim must be even and in [2, 2048], got ", s.head_dim);
  UNTIED_CHECK(s.row_stride == 0 || s.row_stride >= s.heads * s.head_dim, "rope: row_stride (",
               s.row_stride, ") is shorter than heads*head_dim (", s.heads * s.head_dim, ")");
  UNTIED_CHECK(s.first_position >= 0, "rope: first_position must be >= 0, got ", s.first_position);
  UNTIED_CHECK(s.theta > 0.0, "rope: theta must be > 0, got ", s.theta);
  UNTIED_CHECK(s.scaling.type == RopeScalingType::kNone || s.scaling.factor > 0.0,
               "rope: the scaling factor must be > 0, got ", s.scaling.factor);
  UNTIED_CHECK(s.scaling.type != RopeScalingType::kLlama3 ||
                   (s.scaling.low_freq_factor > 0.0 && s.scaling.high_freq_factor > s.scaling.low_freq_factor &&
                    s.scaling.original_max_position > 0.0),
               "rope: llama3 scaling needs 0 < low_freq_factor < high_freq_factor and original_max_position > 0");
  UNTIED_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16, "rope: storage must be f32 or bf16, got ",
               dtype_name(s.dtype));
}

void rope_forward(Device& dev, const RopeShape& s, void* x, const int64_t* positions) {
  validate(s);
  run_op(dev, &KernelTable::rope, "rope", RopeCall{.s = s, .x = x, .positions = positions, .dir = Direction::kForward});
}

void rope_backward(Device& dev, const RopeShape& s, void* dx, const int64_t* positions) {
  validate(s);
  run_op(dev, &KernelTable::rope, "rope", RopeCall{.s = s, .x = dx, .positions = positions, .dir = Direction::kInverse});
}

}  // namespace untied

#include "untied/kernels/rmsnorm.h"

#include <cmath>

#include "kernels/backend.h"
#include "untied/core/check.h"

namespace untied {

void validate(const RmsNormShape& s) {
  UNTIED_CHECK(s.rows >= 0, "rmsnorm: rows must be >= 0, got ", s.rows);
  UNTIED_CHECK(s.dim >= 1, "rmsnorm: dim must be >= 1, got ", s.dim);
  UNTIED_CHECK(std::isfinite(s.eps) && s.eps >= 0.0f, "rmsnorm: eps must be finite and >= 0, got ", s.eps);
  UNTIED_CHECK(s.row_stride == 0 || s.row_stride >= s.dim, "rmsnorm: row_stride (", s.row_stride,
               ") is shorter than dim (", s.dim, ")");
  UNTIED_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16,
               "rmsnorm: dtype (storage of x, y) must be f32 or bf16, got ", dtype_name(s.dtype));
  UNTIED_CHECK(s.weight_dtype == DType::kF32 || s.weight_dtype == DType::kBF16,
               "rmsnorm: weight_dtype must be f32 or bf16, got ", dtype_name(s.weight_dtype));
}

void rmsnorm_forward(Device& dev, const RmsNormShape& s, void* y, float* rstd, const void* x,
                     const void* w) {
  validate(s);
  run_op(dev, &KernelTable::rmsnorm_forward, "rmsnorm_forward",
         RmsNormForwardCall{.s = s, .y = y, .rstd = rstd, .x = x, .w = w});
}

ScratchRequest rmsnorm_backward_scratch(const Device&, const RmsNormBackwardCall& c) {
  ScratchRequest r;
  const int64_t blocks = (c.s.rows + kRmsNormRowBlock - 1) / kRmsNormRowBlock;
  r.set(kRmsNormBlockSums, blocks * c.s.dim * 8, Tag::kOther, "rmsnorm dw block sums");
  return r;
}

void rmsnorm_backward(Device& dev, const RmsNormShape& s, void* dx, float* dw, const void* x,
                      const float* rstd, const void* w, const void* dy) {
  validate(s);
  run_op(dev, &KernelTable::rmsnorm_backward, "rmsnorm_backward",
         RmsNormBackwardCall{.s = s, .dx = dx, .dw = dw, .x = x, .rstd = rstd, .w = w, .dy = dy});
}

}  // namespace untied

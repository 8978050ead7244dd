#include "untied/kernels/swiglu.h"

#include "kernels/backend.h"
#include "untied/core/check.h"

namespace untied {

void validate(const SwigluShape& s) {
  UNTIED_CHECK(s.rows >= 0, "swiglu: rows must be >= 0, got ", s.rows);
  UNTIED_CHECK(s.dim >= 1, "swiglu: dim (F) must be >= 1, got ", s.dim);
  UNTIED_CHECK(s.in_row_stride == 0 || s.in_row_stride >= s.dim, "swiglu: in_row_stride (",
               s.in_row_stride, ") is shorter than dim (", s.dim, ")");
  UNTIED_CHECK(s.out_row_stride == 0 || s.out_row_stride >= s.dim, "swiglu: out_row_stride (",
               s.out_row_stride, ") is shorter than dim (", s.dim, ")");
  UNTIED_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16,
               "swiglu: dtype must be f32 or bf16, got ", dtype_name(s.dtype));
}

void swiglu_forward(Device& dev, const SwigluShape& s, void* out, const void* gate, const void* up) {
  validate(s);
  run_op(dev, &KernelTable::swiglu_forward, "swiglu_forward", SwigluForwardCall{.s = s, .out = out, .gate = gate, .up = up});
}

void swiglu_backward(Device& dev, const SwigluShape& s, void* dgate, void* dup, const void* gate,
                     const void* up, const void* dout) {
  validate(s);
  run_op(dev, &KernelTable::swiglu_backward, "swiglu_backward",
         SwigluBackwardCall{.s = s, .dgate = dgate, .dup = dup, .gate = gate, .up = up, .dout = dout});
}

}  // namespace untied

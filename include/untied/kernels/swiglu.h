// SwiGLU, the gated MLP activation: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
//
// Layouts (token-major): gate, up, dgate, dup (rows, F) with row stride `in_row_stride`
// (0 = F); out, dout (rows, F) with row stride `out_row_stride` (0 = F). A fused gate_up
// projection output (rows, 2F) is used as gate = buf, up = buf + F, in_row_stride = 2F.
// Storage f32 or bf16 (`dtype`, all tensors); compute fp32; bf16 outputs rounded once.
//
// Backward (both overwritten, =):
//   dgate = dout * up * s * (1 + g (1 - s)),  s = sigmoid(g);   dup = dout * silu(g).
// In place: every element is read before it is written, so (same pointer, equal strides)
//   forward:  out may alias gate or up (when out_row_stride == in_row_stride);
//   backward: dgate may alias gate and dup may alias up (the fused gate_up buffer receives its
//             own gradient).
// No other overlap is allowed.
//
// Workspace: none.
// REQUIRES: rows >= 0, F >= 1, strides >= F.
#pragma once

#include <cstdint>

#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

struct SwigluShape {
  int64_t rows = 0;
  int64_t dim = 0;             // F, the MLP intermediate size
  int64_t in_row_stride = 0;   // gate, up, dgate, dup; 0 = dim
  int64_t out_row_stride = 0;  // out, dout; 0 = dim
  DType dtype = DType::kF32;
};

// Throws Error(kInvalidArgument) naming the bad field.
void validate(const SwigluShape& s);

// out (rows, F) =.
void swiglu_forward(Device& dev, const SwigluShape& s, void* out, const void* gate, const void* up);

// dgate, dup (rows, F) =, from the saved gate and up and dout.
void swiglu_backward(Device& dev, const SwigluShape& s, void* dgate, void* dup, const void* gate,
                     const void* up, const void* dout);

}  // namespace untied

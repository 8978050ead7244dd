// Rotary position embedding, Hugging Face Llama convention ("rotate_half"): for a head vector x
// of size D and i < D/2, with angle a = pos * theta^(-2i/D),
//   y[i]       = x[i] * cos(a) - x[i + D/2] * sin(a)
//   y[i + D/2] = x[i + D/2] * cos(a) + x[i] * sin(a)
// Angles are computed in double from each token's explicit global position, so positions in
// the millions keep full fp32 accuracy. `scaling` rescales the frequencies (RopeScaling).
// Backward is the inverse rotation (RoPE is orthogonal): dx = R(-a) dy.
//
// Both work in place on x (tokens, heads, D) with row stride `row_stride` (elements between
// tokens; 0 = heads*D), f32 or bf16 storage. REQUIRES: D even, D <= 2048.
// Positions: `positions` has `tokens` entries (device memory: host on the CPU, GPU memory on
// CUDA), or is null, and then token t is at position first_position + t (a rank's contiguous
// slice of the sequence; no table to copy to the device).
#pragma once

#include <cstdint>

#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

// Frequency scaling for contexts longer than the model was trained on (Hugging Face
// rope_scaling / rope_parameters), applied to inv_freq_i = theta^(-2i/D):
//   kLinear  inv_freq_i / factor (positions divided by factor);
//   kLlama3  with wavelength w = 2 pi / inv_freq_i, L = original_max_position,
//            w > L / low_freq_factor: inv_freq_i / factor; w < L / high_freq_factor: inv_freq_i;
//            between: (1 - s) inv_freq_i / factor + s inv_freq_i, s = (L / w - low) / (high - low).
enum class RopeScalingType { kNone, kLinear, kLlama3 };
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // kLlama3
  double original_max_position = 8192.0;                 // kLlama3
};

struct RopeShape {
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t row_stride = 0;  // 0 = heads * head_dim
  double theta = 10000.0;
  DType dtype = DType::kF32;
  int64_t first_position = 0;  // used when positions is null
  RopeScaling scaling = {};
};

void validate(const RopeShape& s);

// x (tokens, heads, D): x = R(pos) x. positions may be null (see above).
void rope_forward(Device& dev, const RopeShape& s, void* x, const int64_t* positions);
// dx (tokens, heads, D): dx = R(pos)^T dx.
void rope_backward(Device& dev, const RopeShape& s, void* dx, const int64_t* positions);

}  // namespace untied

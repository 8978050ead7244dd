// The RoPE frequency of pair i (rope.h: theta^(-2i/D), then RopeScaling), in double: the one
// definition both backends use (host code on the CPU, device code in the CUDA kernel).
#pragma once

#include <cmath>
#include <cstdint>

#include "untied/kernels/rope.h"

#if defined(__CUDACC__)
#define UNTIED_ROPE_HD __host__ __device__
#else
#define UNTIED_ROPE_HD
#endif

namespace untied {

UNTIED_ROPE_HD inline double rope_inv_freq(double theta, int64_t i, int64_t head_dim, const RopeScaling& s) {
  const double f = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  switch (s.type) {
    case RopeScalingType::kNone: return f;
    case RopeScalingType::kLinear: return f / s.factor;
    case RopeScalingType::kLlama3: {
      const double wavelen = 2.0 * 3.14159265358979323846 / f;
      const double low_wavelen = s.original_max_position / s.low_freq_factor;
      const double high_wavelen = s.original_max_position / s.high_freq_factor;
      if (wavelen < high_wavelen) return f;
      if (wavelen > low_wavelen) return f / s.factor;
      const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      return (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
  return f;
}

}  // namespace untied

// exp2 for the softmax inner loops, written so that g++ vectorizes it (AVX2/FMA with
// -march=native): plain float arithmetic and bit moves, no library calls, no branches.
//
// Range reduction: x = n + f with n = round(x) and f in [-0.5, 0.5], by the 1.5*2^23 trick
// (adding it leaves round(x) in the low mantissa bits); 2^f = e^(f ln 2) by its Taylor series
// to degree 7 (truncation below (0.347)^8/8! < 6e-9, under fp32 rounding); 2^n is built in the
// exponent bits. Domain: callers pass x <= 0 (scores minus their running max, or minus the
// row's log-sum-exp); x > 0 is clamped to 0 and x < -126.5 (including -inf) gives 0, so no
// denormals are produced. NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace untied::cpu {

inline float fast_exp2(float x) {
  // Clamp to [-127, 0]: round(x) = -127 builds exponent bits 0, i.e. the result 0.
  x = x < -127.0f ? -127.0f : x;
  x = x > 0.0f ? 0.0f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23
  const float t = x + shifter;
  const float n = t - shifter;  // round(x)
  int32_t ti;
  std::memcpy(&ti, &t, sizeof ti);
  const int32_t bits = (ti - 0x4B400000 + 127) << 23;  // 2^round(x)
  const float y = (x - n) * 0.693147180559945309f;
  float p = 1.0f / 5040.0f + y * (1.0f / 40320.0f);
  p = 1.0f / 720.0f + y * p;
  p = 1.0f / 120.0f + y * p;
  p = 1.0f / 24.0f + y * p;
  p = 1.0f / 6.0f + y * p;
  p = 0.5f + y * p;
  p = 1.0f + y * p;
  p = 1.0f + y * p;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace untied::cpu

// Element types. f32 is the compute type everywhere on the CPU; bf16 is a storage type there
// (kernels read and write bf16 buffers and compute in fp32). f64 is for references and
// reductions; i32/i64 for indices and counters.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "untied/core/status.h"

namespace untied {

enum class DType : uint8_t { kF32, kBF16, kF64, kI32, kI64 };

int64_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", ...
// Parses "f32" | "fp32" | "float32" | "bf16" | "bfloat16" (the storage types users choose).
StatusOr<DType> parse_dtype(std::string_view s);

// bfloat16 storage: the upper 16 bits of an IEEE float. Conversion from float rounds to
// nearest even; NaN stays NaN.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// Rounds a float to the nearest bf16 and back (what storing in bf16 does to a value).
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// Bulk conversions between a storage buffer of type `t` and fp32 (n elements).
// REQUIRES: t is kF32 or kBF16.
void load_f32(float* dst, const void* src, DType t, int64_t n);
void store_f32(void* dst, DType t, const float* src, int64_t n);

// acc[i] += src[i] for n elements of storage t (f32 or bf16).
void accumulate_f32(float* acc, const void* src, DType t, int64_t n);

// sum_i a[i] * b[i] for n <= 1024 elements of storage t (f32 or bf16), in fp32, i in order.
float dot_f32(const void* a, const void* b, DType t, int64_t n);

}  // namespace untied

#include "untied/core/dtype.h"

#include <string>

namespace untied {

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
  }
  return "?";
}

StatusOr<DType> parse_dtype(std::string_view s) {
  if (s == "f32" || s == "fp32" || s == "float32") return DType::kF32;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  return Status::invalid_argument("unknown dtype '" + std::string(s) + "': use f32 or bf16");
}

void load_f32(float* dst, const void* src, DType t, int64_t n) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  UNTIED_CHECK(t == DType::kBF16, "load_f32 reads f32 or bf16, not ", dtype_name(t));
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(s[i]) << 16;
    std::memcpy(&dst[i], &u, sizeof(float));
  }
}

void store_f32(void* dst, DType t, const float* src, int64_t n) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  UNTIED_CHECK(t == DType::kBF16, "store_f32 writes f32 or bf16, not ", dtype_name(t));
  bf16* d = static_cast<bf16*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
}

void accumulate_f32(float* acc, const void* src, DType t, int64_t n) {
  if (t == DType::kF32) {
    const float* s = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) acc[i] += s[i];
    return;
  }
  UNTIED_CHECK(t == DType::kBF16, "accumulate_f32 reads f32 or bf16, not ", dtype_name(t));
  const bf16* s = static_cast<const bf16*>(src);
  for (int64_t i = 0; i < n; ++i) acc[i] += bf16_to_float(s[i]);
}

float dot_f32(const void* a, const void* b, DType t, int64_t n) {
  UNTIED_CHECK(n >= 0 && n <= 1024, "dot_f32 takes at most 1024 elements, got ", n);
  float ra[1024], rb[1024];
  load_f32(ra, a, t, n);
  load_f32(rb, b, t, n);
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += ra[i] * rb[i];
  return s;
}

}  // namespace untied

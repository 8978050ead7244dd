// SwiGLU on the CPU: element-wise, row-parallel, each row streamed in chunks staged as fp32
// (read in place for f32). Every chunk is read completely before any of it is written, which is
// what lets dgate/dup alias gate/up (swiglu.h).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace untied::cpu {
namespace {

constexpr int64_t kChunk = 256;

// Copies n elements of storage t at p into `stage` as fp32 (a copy even for f32: outputs may
// alias the inputs, so the staged values must not change under the writes).
void stage(float* dst, const char* p, DType t, int64_t n) { load_f32(dst, p, t, n); }

float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void swiglu_forward(Device& dev, const SwigluForwardCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& out = c.out;
  const auto& gate = c.gate;
  const auto& up = c.up;
  if (s.rows == 0) return;
  const int64_t irs = s.in_row_stride > 0 ? s.in_row_stride : s.dim;
  const int64_t ors = s.out_row_stride > 0 ? s.out_row_stride : s.dim;
  const int64_t es = dtype_size(s.dtype);
  const char* g0 = static_cast<const char*>(gate);
  const char* u0 = static_cast<const char*>(up);
  char* o0 = static_cast<char*>(out);

#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t r = 0; r < s.rows; ++r) {
    float gs[kChunk], us[kChunk], os[kChunk];
    for (int64_t c0 = 0; c0 < s.dim; c0 += kChunk) {
      const int64_t n = std::min(kChunk, s.dim - c0);
      stage(gs, g0 + (r * irs + c0) * es, s.dtype, n);
      stage(us, u0 + (r * irs + c0) * es, s.dtype, n);
      for (int64_t i = 0; i < n; ++i) os[i] = (gs[i] * sigmoid(gs[i])) * us[i];
      store_f32(o0 + (r * ors + c0) * es, s.dtype, os, n);
    }
  }
}

void swiglu_backward(Device& dev, const SwigluBackwardCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& dgate = c.dgate;
  const auto& dup = c.dup;
  const auto& gate = c.gate;
  const auto& up = c.up;
  const auto& dout = c.dout;
  if (s.rows == 0) return;
  const int64_t irs = s.in_row_stride > 0 ? s.in_row_stride : s.dim;
  const int64_t ors = s.out_row_stride > 0 ? s.out_row_stride : s.dim;
  const int64_t es = dtype_size(s.dtype);
  const char* g0 = static_cast<const char*>(gate);
  const char* u0 = static_cast<const char*>(up);
  const char* d0 = static_cast<const char*>(dout);
  char* dg0 = static_cast<char*>(dgate);
  char* du0 = static_cast<char*>(dup);

#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t r = 0; r < s.rows; ++r) {
    float gs[kChunk], us[kChunk], ds[kChunk], dgs[kChunk], dus[kChunk];
    for (int64_t c0 = 0; c0 < s.dim; c0 += kChunk) {
      const int64_t n = std::min(kChunk, s.dim - c0);
      stage(gs, g0 + (r * irs + c0) * es, s.dtype, n);
      stage(us, u0 + (r * irs + c0) * es, s.dtype, n);
      stage(ds, d0 + (r * ors + c0) * es, s.dtype, n);
      for (int64_t i = 0; i < n; ++i) {
        const float g = gs[i], sg = sigmoid(g);
        const float silu = g * sg;
        dus[i] = ds[i] * silu;
        dgs[i] = (ds[i] * us[i]) * (sg * (1.0f + g * (1.0f - sg)));
      }
      store_f32(dg0 + (r * irs + c0) * es, s.dtype, dgs, n);
      store_f32(du0 + (r * irs + c0) * es, s.dtype, dus, n);
    }
  }
}

}  // namespace untied::cpu

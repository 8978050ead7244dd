// RoPE on the CPU: one cos/sin table per call, (tokens, D/2), computed in double from each
// token's global position (fast_sincos.h: vectorized, and the same floats as glibc's sincos but
// at arguments within about 2^-51 of a float rounding boundary), then a rotation of every head's
// pair (i, i + D/2).
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/fast_sincos.h"
#include "kernels/rope_freq.h"

namespace untied::cpu {

namespace {
enum RopeScratch { kCosSin };
}  // namespace

ScratchRequest rope_scratch(const Device&, const RopeCall& c) {
  ScratchRequest r;
  r.set(kCosSin, c.s.tokens * (c.s.head_dim / 2) * 2 * 4, Tag::kAttnWorkspace, "rope cos/sin table");
  return r;
}

void rope(Device& dev, const RopeCall& c, const Scratch& scratch) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& x = c.x;
  const auto& positions = c.positions;
  const auto& dir = c.dir;
  const bool inverse = dir == Direction::kInverse;
  const int64_t half = s.head_dim / 2;
  const int64_t rs = s.row_stride > 0 ? s.row_stride : s.heads * s.head_dim;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = rope_inv_freq(s.theta, i, s.head_dim, s.scaling);
  float* cs = scratch.as<float>(kCosSin);
  const float sign = inverse ? -1.0f : 1.0f;
  const int64_t es = dtype_size(s.dtype);

#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t t = 0; t < s.tokens; ++t) {
    float* c = cs + t * half * 2;
    float* sn = c + half;
    const double pos = static_cast<double>(positions ? positions[t] : s.first_position + t);
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      double sv, cv;
      fast_sincos(pos * inv_freq[i], &sv, &cv);
      c[i] = static_cast<float>(cv);
      sn[i] = sign * static_cast<float>(sv);
    }
    float row[2048];  // D <= 2048 is checked by validate()
    for (int64_t h = 0; h < s.heads; ++h) {
      char* p = static_cast<char*>(x) + (t * rs + h * s.head_dim) * es;
      load_f32(row, p, s.dtype, s.head_dim);
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = row[i], x2 = row[i + half];
        row[i] = x1 * c[i] - x2 * sn[i];
        row[i + half] = x2 * c[i] + x1 * sn[i];
      }
      store_f32(p, s.dtype, row, s.head_dim);
    }
  }
}

}  // namespace untied::cpu

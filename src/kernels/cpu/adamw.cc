// AdamW and the clipping helpers on the CPU: element-wise loops, thread-parallel over fixed
// blocks of elements. The sum of squares is summed per block in fp64 lanes and then over the
// blocks in order, so it is the same for every thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/model_kernels.h"

namespace untied::cpu {
namespace {

constexpr int64_t kBlock = 65536;  // elements per fp64 partial sum (adamw.h)
constexpr int64_t kLanes = 8;

int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }

}  // namespace

void adamw_step(Device& dev, float* p, float* m, float* v, const float* g, int64_t n,
                const AdamWParams& a) {
  if (!dev.backed() || n == 0) return;
  const double t = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), t);
  const float step_size = static_cast<float>(static_cast<double>(a.lr) / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = a.decay ? static_cast<float>(1.0 - static_cast<double>(a.lr) * a.weight_decay) : 1.0f;
  const float b1 = a.beta1, b2 = a.beta2, omb1 = 1.0f - a.beta1, omb2 = 1.0f - a.beta2, eps = a.eps;
  const int64_t blocks = blocks_of(n);

#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i1 = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < i1; ++i) {
      const float gi = g[i];
      const float mi = b1 * m[i] + omb1 * gi;
      const float vi = b2 * v[i] + omb2 * (gi * gi);
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - step_size * (mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps));
    }
  }
}

double grad_sum_squares(Device& dev, const float* g, int64_t n) {
  const int64_t blocks = blocks_of(n);
  Buffer part_buf = dev.allocator().allocate(blocks * 8, Tag::kOther, "grad sum of squares blocks");
  if (!dev.backed() || n == 0) return 0.0;
  double* part = part_buf.as<double>();

#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
    double lanes[kLanes] = {};
    int64_t i = i0;
    for (; i + kLanes <= i1; i += kLanes)
      for (int64_t k = 0; k < kLanes; ++k) {
        const double x = g[i + k];
        lanes[k] += x * x;
      }
    for (; i < i1; ++i) lanes[0] += static_cast<double>(g[i]) * g[i];
    double s = 0;
    for (int64_t k = 0; k < kLanes; ++k) s += lanes[k];
    part[b] = s;
  }
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) total += part[b];
  return total;
}

void scale_in_place(Device& dev, float* x, int64_t n, float scale) {
  if (!dev.backed() || n == 0) return;
  const int64_t blocks = blocks_of(n);
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i1 = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < i1; ++i) x[i] *= scale;
  }
}

}  // namespace untied::cpu

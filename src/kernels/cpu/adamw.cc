// AdamW and the clipping helpers on the CPU: element-wise loops, thread-parallel over fixed
// blocks of elements. The sum of squares is summed per block in fp64 lanes and then over the
// blocks in order, so it is the same for every thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace untied::cpu {
namespace {

constexpr int64_t kBlock = 65536;  // elements per fp64 partial sum (adamw.h)
constexpr int64_t kLanes = 8;

int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }
enum SumSquaresScratch { kBlockSums };

}  // namespace

void adamw_step(Device& dev, const AdamWCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& p = c.p;
  const auto& m = c.m;
  const auto& v = c.v;
  const auto& g = c.g;
  const auto& n = c.n;
  const auto& a = c.a;
  if (n == 0) return;
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

ScratchRequest grad_sum_squares_scratch(const Device&, const SumSquaresCall& c) {
  ScratchRequest r;
  r.set(kBlockSums, blocks_of(c.n) * 8, Tag::kOther, "grad sum of squares blocks");
  return r;
}

void grad_sum_squares(Device& dev, const SumSquaresCall& c, const Scratch& scratch) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& g = c.g;
  const auto& n = c.n;
  const auto& result = c.result;
  *result = 0.0;
  if (n == 0) return;
  const int64_t blocks = blocks_of(n);
  double* part = scratch.as<double>(kBlockSums);

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
  *result = total;
}

void scale_in_place(Device& dev, const ScaleCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& x = c.x;
  const auto& n = c.n;
  const auto& scale = c.scale;
  if (n == 0) return;
  const int64_t blocks = blocks_of(n);
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i1 = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < i1; ++i) x[i] *= scale;
  }
}

}  // namespace untied::cpu

// RMSNorm on the CPU. Rows are independent in forward and in dx, so both run row-parallel; each
// row is streamed in chunks of kChunk elements widened to fp32 on the stack (bf16) or read in
// place (f32). Row sums use 16 fp32 lanes (vectorizable without reassociation) combined in fp64.
// dw is the one reduction over rows: fp64 sums per (row block, column chunk) tile, then over the
// row blocks in order, so the result is the same for every thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace untied::cpu {
namespace {

constexpr int64_t kChunk = 256;       // elements staged per step (multiple of kLanes)
constexpr int64_t kLanes = 16;        // independent fp32 partial sums per row
constexpr int64_t kRowBlock = kRmsNormRowBlock;  // rows per fp64 partial sum of dw (rmsnorm.h)

// n elements of storage t at p as fp32: p itself for f32, else widened into `stage`.
const float* as_f32(float* stage, const void* p, DType t, int64_t n) {
  if (t == DType::kF32) return static_cast<const float*>(p);
  load_f32(stage, p, t, n);
  return stage;
}

const char* at(const void* base, int64_t elem, int64_t es) {
  return static_cast<const char*>(base) + elem * es;
}
char* at(void* base, int64_t elem, int64_t es) { return static_cast<char*>(base) + elem * es; }

// lanes[i % kLanes] += a[i] * b[i] (the tail into lane 0).
void dot_lanes(float* lanes, const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) lanes[0] += a[i] * b[i];
}

double sum_lanes(const float* lanes) {
  double s = 0;
  for (int64_t j = 0; j < kLanes; ++j) s += lanes[j];
  return s;
}

}  // namespace

void rmsnorm_forward(Device& dev, const RmsNormForwardCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& y = c.y;
  const auto& rstd = c.rstd;
  const auto& x = c.x;
  const auto& w = c.w;
  if (s.rows == 0) return;
  const int64_t rs = s.row_stride > 0 ? s.row_stride : s.dim;
  const int64_t es = dtype_size(s.dtype), wes = dtype_size(s.weight_dtype);

#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t r = 0; r < s.rows; ++r) {
    float xs[kChunk], ws[kChunk], ys[kChunk];
    const char* xr = at(x, r * rs, es);
    float lanes[kLanes] = {};
    for (int64_t c0 = 0; c0 < s.dim; c0 += kChunk) {
      const int64_t n = std::min(kChunk, s.dim - c0);
      const float* xv = as_f32(xs, xr + c0 * es, s.dtype, n);
      dot_lanes(lanes, xv, xv, n);
    }
    const double ms = sum_lanes(lanes) / static_cast<double>(s.dim);
    const float rr = static_cast<float>(1.0 / std::sqrt(ms + static_cast<double>(s.eps)));
    rstd[r] = rr;
    char* yr = at(y, r * rs, es);
    for (int64_t c0 = 0; c0 < s.dim; c0 += kChunk) {
      const int64_t n = std::min(kChunk, s.dim - c0);
      const float* xv = as_f32(xs, xr + c0 * es, s.dtype, n);
      const float* wv = as_f32(ws, at(w, c0, wes), s.weight_dtype, n);
      float* yv = s.dtype == DType::kF32 ? reinterpret_cast<float*>(yr) + c0 : ys;
      for (int64_t i = 0; i < n; ++i) yv[i] = (xv[i] * rr) * wv[i];
      if (s.dtype != DType::kF32) store_f32(yr + c0 * es, s.dtype, ys, n);
    }
  }
}

void rmsnorm_backward(Device& dev, const RmsNormBackwardCall& c, const Scratch& scratch) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& dx = c.dx;
  const auto& dw = c.dw;
  const auto& x = c.x;
  const auto& rstd = c.rstd;
  const auto& w = c.w;
  const auto& dy = c.dy;
  if (s.rows == 0) return;
  const int64_t blocks = (s.rows + kRowBlock - 1) / kRowBlock;
  const int64_t rs = s.row_stride > 0 ? s.row_stride : s.dim;
  const int64_t es = dtype_size(s.dtype), wes = dtype_size(s.weight_dtype);
  const double inv_dim = 1.0 / static_cast<double>(s.dim);

  // dx, row-parallel: dx = r * (w * dy) - (r^3 / dim * sum_j w_j dy_j x_j) * x.
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t r = 0; r < s.rows; ++r) {
    float xs[kChunk], ws[kChunk], gs[kChunk], wg[kChunk], out[kChunk];
    const char* xr = at(x, r * rs, es);
    const char* gr = at(dy, r * rs, es);
    const float rr = rstd[r];
    float lanes[kLanes] = {};
    for (int64_t c0 = 0; c0 < s.dim; c0 += kChunk) {
      const int64_t n = std::min(kChunk, s.dim - c0);
      const float* xv = as_f32(xs, xr + c0 * es, s.dtype, n);
      const float* gv = as_f32(gs, gr + c0 * es, s.dtype, n);
      const float* wv = as_f32(ws, at(w, c0, wes), s.weight_dtype, n);
      for (int64_t i = 0; i < n; ++i) wg[i] = wv[i] * gv[i];
      dot_lanes(lanes, wg, xv, n);
    }
    const double rd = rr;
    const float c = static_cast<float>(rd * rd * rd * inv_dim * sum_lanes(lanes));
    char* dr = at(dx, r * rs, es);
    for (int64_t c0 = 0; c0 < s.dim; c0 += kChunk) {
      const int64_t n = std::min(kChunk, s.dim - c0);
      const float* xv = as_f32(xs, xr + c0 * es, s.dtype, n);
      const float* gv = as_f32(gs, gr + c0 * es, s.dtype, n);
      const float* wv = as_f32(ws, at(w, c0, wes), s.weight_dtype, n);
      for (int64_t i = 0; i < n; ++i) out[i] = rr * (wv[i] * gv[i]) - c * xv[i];
      store_f32(dr + c0 * es, s.dtype, out, n);
    }
  }

  // dw: fp64 sums of dy * (x * r) per (row block, column chunk), rows in order...
  double* part = scratch.as<double>(kRmsNormBlockSums);
  const int64_t col_chunks = (s.dim + kChunk - 1) / kChunk;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(dev.threads())
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t cc = 0; cc < col_chunks; ++cc) {
      float xs[kChunk], gs[kChunk];
      double acc[kChunk] = {};
      const int64_t c0 = cc * kChunk, n = std::min(kChunk, s.dim - c0);
      const int64_t r1 = std::min(s.rows, (b + 1) * kRowBlock);
      for (int64_t r = b * kRowBlock; r < r1; ++r) {
        const float* xv = as_f32(xs, at(x, r * rs + c0, es), s.dtype, n);
        const float* gv = as_f32(gs, at(dy, r * rs + c0, es), s.dtype, n);
        const float rr = rstd[r];
        for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<double>(gv[i] * (xv[i] * rr));
      }
      for (int64_t i = 0; i < n; ++i) part[b * s.dim + c0 + i] = acc[i];
    }
  }
  // ... then over the blocks in order, added to dw once.
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t cc = 0; cc < col_chunks; ++cc) {
    const int64_t c0 = cc * kChunk, n = std::min(kChunk, s.dim - c0);
    double acc[kChunk] = {};
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t i = 0; i < n; ++i) acc[i] += part[b * s.dim + c0 + i];
    for (int64_t i = 0; i < n; ++i) dw[c0 + i] = static_cast<float>(dw[c0 + i] + acc[i]);
  }
}

}  // namespace untied::cpu

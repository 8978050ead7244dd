// The mixture-of-experts row movements (include/untied/kernels/moe.h) on the CPU: OpenMP over
// rows, the dtype helpers of core/dtype.h inside.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace untied::cpu {

void gather_rows(Device& dev, const GatherRowsCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& dst = c.dst;
  const auto& src = c.src;
  const auto& idx = c.idx;
  const int64_t row_bytes = s.dim * dtype_size(s.dtype);
  for (int64_t i = 0; i < s.m; ++i)
    UNTIED_CHECK(idx[i] >= 0 && idx[i] < c.src_rows, "gather_rows: index ", idx[i], " at ", i, " is outside the ",
                 c.src_rows, " rows");
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t i = 0; i < s.m; ++i)
    std::memcpy(static_cast<char*>(dst) + i * row_bytes, static_cast<const char*>(src) + idx[i] * row_bytes,
                static_cast<size_t>(row_bytes));
}

void combine_rows(Device& dev, const CombineRowsCall& c, const Scratch&) {
  const auto& s = c.s;
  const auto& out = c.out;
  const auto& ys = c.ys;
  const auto& pos = c.pos;
  const auto& w = c.w;
  const auto& accumulate = c.accumulate;
  const int64_t es = dtype_size(s.dtype);
#pragma omp parallel num_threads(dev.threads())
  {
    std::vector<float> acc(static_cast<size_t>(s.dim)), row(static_cast<size_t>(s.dim));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < s.n; ++r) {
      char* o = static_cast<char*>(out) + r * s.dim * es;
      if (accumulate) load_f32(acc.data(), o, s.dtype, s.dim);
      else std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < s.k; ++j) {
        const int64_t p = pos[r * s.k + j];
        const float wj = w == nullptr ? 1.0f : w[r * s.k + j];
        load_f32(row.data(), static_cast<const char*>(ys) + p * s.dim * es, s.dtype, s.dim);
        for (int64_t d = 0; d < s.dim; ++d) acc[static_cast<size_t>(d)] += wj * row[static_cast<size_t>(d)];
      }
      store_f32(o, s.dtype, acc.data(), s.dim);
    }
  }
}

void combine_rows_backward(Device& dev, const CombineRowsBackwardCall& c, const Scratch&) {
  const auto& s = c.s;
  const auto& dys = c.dys;
  const auto& dw = c.dw;
  const auto& dy = c.dy;
  const auto& ys = c.ys;
  const auto& pos = c.pos;
  const auto& w = c.w;
  const int64_t es = dtype_size(s.dtype);
#pragma omp parallel num_threads(dev.threads())
  {
    std::vector<float> g(static_cast<size_t>(s.dim)), y(static_cast<size_t>(s.dim)), out(static_cast<size_t>(s.dim));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < s.n; ++r) {
      load_f32(g.data(), static_cast<const char*>(dy) + r * s.dim * es, s.dtype, s.dim);
      for (int64_t j = 0; j < s.k; ++j) {
        const int64_t p = pos[r * s.k + j];
        const float wj = w[r * s.k + j];
        load_f32(y.data(), static_cast<const char*>(ys) + p * s.dim * es, s.dtype, s.dim);
        float dot = 0.0f;
        for (int64_t d = 0; d < s.dim; ++d) {
          dot += g[static_cast<size_t>(d)] * y[static_cast<size_t>(d)];
          out[static_cast<size_t>(d)] = wj * g[static_cast<size_t>(d)];
        }
        dw[r * s.k + j] = dot;
        store_f32(static_cast<char*>(dys) + p * s.dim * es, s.dtype, out.data(), s.dim);
      }
    }
  }
}

}  // namespace untied::cpu

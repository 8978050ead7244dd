// Token embedding on the CPU. Forward copies (and converts) one table row per token,
// token-parallel. Backward is column-parallel: each thread owns a range of the E columns of
// dtable and walks all tokens in order, so repeated ids accumulate in token order without
// atomics or per-thread copies, identically for any thread count.
#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"
#include "untied/core/check.h"

namespace untied::cpu {
namespace {

constexpr int64_t kColChunk = 256;  // columns per unit of backward work

// Throws before anything is written if some id is outside [0, vocab).
void check_ids(const EmbeddingShape& s, const int32_t* ids) {
  for (int64_t t = 0; t < s.tokens; ++t)
    UNTIED_CHECK(ids[t] >= 0 && ids[t] < s.vocab, "embedding: ids[", t, "] = ", ids[t],
                 " is outside [0, vocab = ", s.vocab, ")");
}

}  // namespace

void embedding_forward(Device& dev, const EmbeddingForwardCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& out = c.out;
  const auto& ids = c.ids;
  const auto& table = c.table;
  if (s.tokens == 0) return;
  check_ids(s, ids);
  const int64_t es = dtype_size(s.dtype), tes = dtype_size(s.table_dtype);
  const char* tab = static_cast<const char*>(table);
  char* o = static_cast<char*>(out);

#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t t = 0; t < s.tokens; ++t) {
    const char* src = tab + static_cast<int64_t>(ids[t]) * s.dim * tes;
    char* dst = o + t * s.dim * es;
    if (s.dtype == s.table_dtype) {
      std::copy(src, src + s.dim * es, dst);
      continue;
    }
    float stage[kColChunk];
    for (int64_t c0 = 0; c0 < s.dim; c0 += kColChunk) {
      const int64_t n = std::min(kColChunk, s.dim - c0);
      load_f32(stage, src + c0 * tes, s.table_dtype, n);
      store_f32(dst + c0 * es, s.dtype, stage, n);
    }
  }
}

void embedding_backward(Device& dev, const EmbeddingBackwardCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& dtable = c.dtable;
  const auto& ids = c.ids;
  const auto& dout = c.dout;
  if (s.tokens == 0) return;
  check_ids(s, ids);
  const int64_t es = dtype_size(s.dtype);
  const char* g = static_cast<const char*>(dout);
  const int64_t chunks = (s.dim + kColChunk - 1) / kColChunk;

#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t cc = 0; cc < chunks; ++cc) {
    const int64_t c0 = cc * kColChunk, n = std::min(kColChunk, s.dim - c0);
    float stage[kColChunk];
    for (int64_t t = 0; t < s.tokens; ++t) {
      float* dst = dtable + static_cast<int64_t>(ids[t]) * s.dim + c0;
      const float* src;
      if (s.dtype == DType::kF32) {
        src = reinterpret_cast<const float*>(g + (t * s.dim + c0) * es);
      } else {
        load_f32(stage, g + (t * s.dim + c0) * es, s.dtype, n);
        src = stage;
      }
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    }
  }
}

}  // namespace untied::cpu

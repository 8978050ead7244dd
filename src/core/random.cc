#include "untied/core/random.h"

#include <algorithm>

namespace untied {

void fill_hash_uniform(const Tensor& t, uint64_t seed, uint64_t stream, int64_t first_index, float scale) {
  UNTIED_CHECK(t.is_contiguous(), "fill_hash_uniform needs a contiguous tensor");
  if (t.data() == nullptr) return;  // rehearsal
  const int64_t n = t.numel();
  constexpr int64_t kChunk = 4096;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    float buf[kChunk];
    const int64_t m = std::min(kChunk, n - c0);
    for (int64_t i = 0; i < m; ++i)
      buf[i] = scale * hash_uniform(seed, stream, static_cast<uint64_t>(first_index + c0 + i));
    store_f32(static_cast<char*>(t.data()) + c0 * dtype_size(t.dtype()), t.dtype(), buf, m);
  }
}

}  // namespace untied

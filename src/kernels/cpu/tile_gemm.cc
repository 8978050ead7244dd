// Register-blocked fp32 GEMM for attention tiles (tile_gemm.h).
//
// Written once over GCC/Clang vector extensions, so that the same source becomes AVX-512,
// AVX2, SSE or NEON code for whatever -march the build uses. The micro-kernel keeps an
// MR x NR block of C in registers (NR = 2 vectors), streams one row of B (2 vector loads) and
// MR broadcasts of A per step of k, and so does 2*MR fused multiply-adds per 2 loads of B. Rows
// of C left over (m % MR) use the same kernel with fewer rows; columns left over use one-vector
// panels and then a scalar loop.
#include "kernels/cpu/tile_gemm.h"

#include <array>
#include <cstring>
#include <utility>

namespace untied::cpu {

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kMaxRows = 12;  // 24 accumulators + 2 of B in 32 registers
constexpr const char* kIsa = "avx512";
#elif defined(__AVX__)
constexpr int kLanes = 8;
constexpr int kMaxRows = 6;  // 12 + 2 in 16 registers
constexpr const char* kIsa = "avx2";
#elif defined(__aarch64__)
constexpr int kLanes = 4;
constexpr int kMaxRows = 12;  // 24 + 2 in 32 registers
constexpr const char* kIsa = "neon";
#else
constexpr int kLanes = 4;
constexpr int kMaxRows = 6;
constexpr const char* kIsa = "sse";
#endif

using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// C[0:MR, 0:NV*kLanes] = alpha * op(A)[0:MR, :] B[:, 0:NV*kLanes] + beta * C.
template <int MR, int NV, bool TA>
void micro(int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec{};
  for (int64_t p = 0; p < k; ++p) {
    Vec bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = load(b + p * ldb + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const float x = TA ? a[p * lda + r] : a[r * lda + p];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += x * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + v * kLanes;
      const Vec out = beta == 0.0f ? alpha * acc[r][v] : alpha * acc[r][v] + beta * load(cp);
      store(cp, out);
    }
}

using MicroFn = void (*)(int64_t, float, const float*, int64_t, const float*, int64_t, float, float*, int64_t);

template <int NV, bool TA, int... R>
constexpr auto make_table(std::integer_sequence<int, R...>) {
  return std::array<MicroFn, sizeof...(R)>{&micro<R + 1, NV, TA>...};
}
// kMicro[nv - 1][trans_a][rows - 1]
const std::array<MicroFn, kMaxRows> kMicro[2][2] = {
    {make_table<1, false>(std::make_integer_sequence<int, kMaxRows>{}),
     make_table<1, true>(std::make_integer_sequence<int, kMaxRows>{})},
    {make_table<2, false>(std::make_integer_sequence<int, kMaxRows>{}),
     make_table<2, true>(std::make_integer_sequence<int, kMaxRows>{})}};

// Columns [n0, n) of C, one element at a time (fewer than kLanes of them).
void scalar_columns(bool trans_a, int64_t m, int64_t n0, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = n0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t p = 0; p < k; ++p) s += (trans_a ? a[p * lda + i] : a[i * lda + p]) * b[p * ldb + j];
      float& out = c[i * ldc + j];
      out = beta == 0.0f ? alpha * s : alpha * s + beta * out;
    }
}

}  // namespace

void tile_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  // Row block i0 of op(A): A + i0 rows (or columns, transposed).
  auto a_rows = [&](int64_t i0) { return trans_a ? a + i0 : a + i0 * lda; };
  int64_t j0 = 0;
  for (int nv = 2; nv >= 1; --nv) {
    const int64_t nr = nv * kLanes;
    const auto& table = kMicro[nv - 1][trans_a ? 1 : 0];
    for (; j0 + nr <= n; j0 += nr) {
      int64_t i0 = 0;
      for (; i0 + kMaxRows <= m; i0 += kMaxRows)
        table[kMaxRows - 1](k, alpha, a_rows(i0), lda, b + j0, ldb, beta, c + i0 * ldc + j0, ldc);
      if (i0 < m) table[m - i0 - 1](k, alpha, a_rows(i0), lda, b + j0, ldb, beta, c + i0 * ldc + j0, ldc);
    }
  }
  if (j0 < n) scalar_columns(trans_a, m, j0, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void transpose_tile(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  // 8 x 8 blocks, so that both sides are read and written in cache lines.
  constexpr int64_t kB = 8;
  for (int64_t r0 = 0; r0 < rows; r0 += kB)
    for (int64_t c0 = 0; c0 < cols; c0 += kB) {
      const int64_t r1 = r0 + kB < rows ? r0 + kB : rows, c1 = c0 + kB < cols ? c0 + kB : cols;
      for (int64_t cc = c0; cc < c1; ++cc)
        for (int64_t r = r0; r < r1; ++r) dst[cc * ldd + r] = src[r * lds + cc];
    }
}

std::string tile_gemm_description() {
  return std::string(kIsa) + " " + std::to_string(kMaxRows) + "x" + std::to_string(2 * kLanes);
}

}  // namespace untied::cpu

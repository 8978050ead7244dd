// GEMM on the CPU: BLAS sgemm, with bf16 operands widened to fp32 scratch; or, when both
// operands are bf16 and the CPU has AVX-512, our own bf16 kernel (bf16_gemm.h) on them as
// they are, into fp32 C or into bf16 C (rounded once from the kernel's fp32 sums, which it keeps
// for a block of columns of a block of rows at a time: kTileBytes at most).
//
// Widening is tiled so that scratch does not grow with the long dimension of activations:
// without transposed A, C is computed in blocks of rows (A's and C's rows widened per block);
// with transposed A (weight gradients, C = A^T B with the sequence as the reduction), the
// reduction is split into blocks of stored rows of A and B, accumulated into C. A block holds
// at most kTileBytes of fp32 per operand (one row at least). B is widened whole when it is not
// tiled with A (it is then a weight: its size does not depend on the sequence).
#include <algorithm>
#include <vector>

#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/sgemm.h"

namespace untied::cpu {
namespace {

constexpr int64_t kTileBytes = int64_t{16} << 20;

// Copies stored rows [r0, r0 + rows) of a matrix with `cols` columns and row stride ld into
// contiguous fp32.
void widen_rows(float* dst, const void* src, DType t, int64_t r0, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t es = dtype_size(t);
  for (int64_t r = 0; r < rows; ++r)
    load_f32(dst + r * cols, static_cast<const char*>(src) + (r0 + r) * ld * es, t, cols);
}

// The inverse: contiguous fp32 rows into stored rows [r0, r0 + rows) of storage t.
void narrow_rows(void* dst, DType t, const float* src, int64_t r0, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t es = dtype_size(t);
  for (int64_t r = 0; r < rows; ++r) store_f32(static_cast<char*>(dst) + (r0 + r) * ld * es, t, src + r * cols, cols);
}

// op(B) gathered (GemmParams::b_group_offsets) into contiguous fp32: B (n, k) with trans_b, else
// B (k, n).
void widen_gathered_b(float* dst, const GemmParams& p) {
  const int64_t es = dtype_size(p.b_dtype), g = p.b_group, groups = p.n / g;
  const char* b = static_cast<const char*>(p.b);
  for (int64_t i = 0; i < groups; ++i) {
    const char* src = b + p.b_group_offsets[i] * es;
    if (p.trans_b)
      for (int64_t r = 0; r < g; ++r) load_f32(dst + (i * g + r) * p.k, src + r * p.ldb * es, p.b_dtype, p.k);
    else
      for (int64_t r = 0; r < p.k; ++r) load_f32(dst + r * p.n + i * g, src + r * p.ldb * es, p.b_dtype, g);
  }
}

int64_t tile_rows(int64_t total, int64_t row_elems) {
  return std::clamp<int64_t>(kTileBytes / (4 * std::max<int64_t>(row_elems, 1)), 1, std::max<int64_t>(total, 1));
}

// Both operands bf16 and the kernel compiled in: no widening of A or B.
bool bf16_kernel(const GemmParams& p) {
  return p.a_dtype == DType::kBF16 && p.b_dtype == DType::kBF16 && bf16_gemm_available();
}

}  // namespace

// Scratch slots; which are set depends on the operands' dtypes and trans_a (see the top).
enum GemmScratch { kGemmA, kGemmB, kGemmC, kGemmPack };

namespace {
ScratchRequest gemm_scratch_for(int threads, const GemmParams& p) {
  ScratchRequest r;
  const bool gathered = p.b_group_offsets != nullptr;
  const bool wa = p.a_dtype != DType::kF32, wb = p.b_dtype != DType::kF32 || gathered, wc = p.c_dtype != DType::kF32;
  if (p.m == 0 || p.n == 0 || p.k == 0 || (!wa && !wb && !wc)) return r;
  if (bf16_kernel(p)) {  // packing space; with bf16 C, a block of its columns' sums for a block of rows
    const int64_t rows = wc ? tile_rows(p.m, bf16_gemm_c_block_cols(p.n)) : p.m;
    r.set(kGemmPack, bf16_gemm_pack_bytes(rows, p.n, p.k, threads, wc), p.scratch_tag,
          wc ? "gemm bf16 packing and C sums" : "gemm bf16 packing");
    return r;
  }
  const int64_t b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;
  if (!p.trans_a) {  // A's and C's rows widened per block of t rows, B whole
    const int64_t t = tile_rows(p.m, std::max(p.k, p.n));
    if (wa) r.set(kGemmA, t * p.k * 4, p.scratch_tag, "gemm A rows in fp32");
    if (wb) r.set(kGemmB, b_rows * b_cols * 4, p.scratch_tag, "gemm B in fp32");
    if (wc) r.set(kGemmC, t * p.n * 4, p.scratch_tag, "gemm C rows in fp32");
    return r;
  }
  // trans_a: A's (and untransposed B's) rows widened per block of t reduction rows, C whole
  const int64_t t = tile_rows(p.k, std::max(p.m, p.n));
  if (wa) r.set(kGemmA, t * p.m * 4, p.scratch_tag, "gemm A rows in fp32");
  if (wb) r.set(kGemmB, p.trans_b ? b_rows * b_cols * 4 : t * p.n * 4, p.scratch_tag,
                p.trans_b ? "gemm B in fp32" : "gemm B rows in fp32");
  if (wc) r.set(kGemmC, p.m * p.n * 4, p.scratch_tag, "gemm C in fp32");
  return r;
}
}  // namespace

ScratchRequest gemm_scratch(const Device& dev, const GemmParams& p) { return gemm_scratch_for(dev.threads(), p); }

}  // namespace untied::cpu

namespace untied {

int64_t cpu_gemm_scratch_bytes(const GemmParams& p, int threads) {
  int64_t sum = 0;
  for (const auto& item : cpu::gemm_scratch_for(threads, p).items) sum += item.set ? item.bytes : 0;
  return sum;
}

}  // namespace untied

namespace untied::cpu {

// C = alpha op(A) op(B) + beta C on the bf16 kernel; bf16 C in blocks of rows whose sums in fp32
// (a block of columns at a time) fit the packing space (op(A)'s rows m0.. start at A + m0 rows,
// or A + m0 columns when transposed).
void gemm_bf16_operands(const Device& dev, const GemmParams& p, const Scratch& ws) {
  const auto* a = static_cast<const uint16_t*>(p.a);
  const auto* b = static_cast<const uint16_t*>(p.b);
  void* const pack = ws.data(kGemmPack);
  if (p.c_dtype == DType::kF32) {
    bf16_gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a, p.lda, b, p.ldb, p.beta, static_cast<float*>(p.c),
              p.ldc, dev.threads(), pack, p.b_group_offsets, p.b_group);
    return;
  }
  auto* const c = static_cast<uint16_t*>(p.c);
  const int64_t t = tile_rows(p.m, bf16_gemm_c_block_cols(p.n));
  for (int64_t m0 = 0; m0 < p.m; m0 += t) {
    const int64_t rows = std::min(t, p.m - m0);
    bf16_gemm_bf16c(p.trans_a, p.trans_b, rows, p.n, p.k, p.alpha, p.trans_a ? a + m0 : a + m0 * p.lda, p.lda, b,
                    p.ldb, p.beta, c + m0 * p.ldc, p.ldc, dev.threads(), pack, p.b_group_offsets, p.b_group);
  }
}

void gemm(Device& dev, const GemmParams& p, const Scratch& ws) {
  if (p.m == 0 || p.n == 0) return;
  const bool gathered = p.b_group_offsets != nullptr;  // (then never trans_a: gemm.cc checks)
  const bool wa = p.a_dtype != DType::kF32, wb = p.b_dtype != DType::kF32 || gathered, wc = p.c_dtype != DType::kF32;
  if (p.k == 0) {
    // BLAS may skip C when k = 0; define it: C = beta * C (beta 0 clears, NaN included).
    std::vector<float> row(static_cast<size_t>(p.n));
    const int64_t es = dtype_size(p.c_dtype);
    for (int64_t r = 0; r < p.m; ++r) {
      char* c = static_cast<char*>(p.c) + r * p.ldc * es;
      load_f32(row.data(), c, p.c_dtype, p.n);
      for (auto& v : row) v = p.beta == 0.0f ? 0.0f : p.beta * v;
      store_f32(c, p.c_dtype, row.data(), p.n);
    }
    return;
  }
  if (bf16_kernel(p)) {
    gemm_bf16_operands(dev, p, ws);
    return;
  }
  if (!wa && !wb && !wc) {
    sgemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, static_cast<const float*>(p.a), p.lda,
          static_cast<const float*>(p.b), p.ldb, p.beta, static_cast<float*>(p.c), p.ldc);
    return;
  }
  const int64_t b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;
  float* const a_buf = ws.as<float>(kGemmA);
  float* const b_buf = ws.as<float>(kGemmB);
  float* const c_buf = ws.as<float>(kGemmC);

  if (!p.trans_a) {
    // C rows [m0, m0 + t) = A rows [m0, m0 + t) op(B).
    const float* b = static_cast<const float*>(p.b);
    int64_t ldb = p.ldb;
    if (wb) {
      if (gathered) widen_gathered_b(b_buf, p);
      else widen_rows(b_buf, p.b, p.b_dtype, 0, b_rows, b_cols, p.ldb);
      b = b_buf, ldb = b_cols;
    }
    const int64_t t = tile_rows(p.m, std::max(p.k, p.n));
    for (int64_t m0 = 0; m0 < p.m; m0 += t) {
      const int64_t rows = std::min(t, p.m - m0);
      const float* a = static_cast<const float*>(p.a) + m0 * p.lda;
      int64_t lda = p.lda;
      if (wa) {
        widen_rows(a_buf, p.a, p.a_dtype, m0, rows, p.k, p.lda);
        a = a_buf, lda = p.k;
      }
      float* c = static_cast<float*>(p.c) + m0 * p.ldc;
      int64_t ldc = p.ldc;
      if (wc) {
        c = c_buf, ldc = p.n;
        if (p.beta != 0.0f) widen_rows(c, p.c, p.c_dtype, m0, rows, p.n, p.ldc);
      }
      sgemm(false, p.trans_b, rows, p.n, p.k, p.alpha, a, lda, b, ldb, p.beta, c, ldc);
      if (wc) narrow_rows(p.c, p.c_dtype, c, m0, rows, p.n, p.ldc);
    }
    return;
  }

  // trans_a: C (m, n) = sum over blocks of stored rows [k0, k0 + t) of A^T B, accumulated.
  float* c = static_cast<float*>(p.c);
  int64_t ldc = p.ldc;
  if (wc) {
    c = c_buf, ldc = p.n;
    if (p.beta != 0.0f) widen_rows(c, p.c, p.c_dtype, 0, p.m, p.n, p.ldc);
  }
  if (wb && p.trans_b) widen_rows(b_buf, p.b, p.b_dtype, 0, b_rows, b_cols, p.ldb);  // B (n, k): whole
  const int64_t t = tile_rows(p.k, std::max(p.m, p.n));
  for (int64_t k0 = 0; k0 < p.k; k0 += t) {
    const int64_t kk = std::min(t, p.k - k0);
    const float* a = static_cast<const float*>(p.a) + k0 * p.lda;
    int64_t lda = p.lda;
    if (wa) {
      widen_rows(a_buf, p.a, p.a_dtype, k0, kk, p.m, p.lda);
      a = a_buf, lda = p.m;
    }
    const float* b;
    int64_t ldb;
    if (p.trans_b) {
      b = wb ? b_buf + k0 : static_cast<const float*>(p.b) + k0;
      ldb = wb ? b_cols : p.ldb;
    } else if (wb) {
      widen_rows(b_buf, p.b, p.b_dtype, k0, kk, p.n, p.ldb);
      b = b_buf, ldb = p.n;
    } else {
      b = static_cast<const float*>(p.b) + k0 * p.ldb, ldb = p.ldb;
    }
    sgemm(true, p.trans_b, p.m, p.n, kk, p.alpha, a, lda, b, ldb, k0 == 0 ? p.beta : 1.0f, c, ldc);
  }
  if (wc) narrow_rows(p.c, p.c_dtype, c, 0, p.m, p.n, p.ldc);
}

}  // namespace untied::cpu

// Shared pieces of the CPU flash-attention forward and backward: tile geometry, the sizes of
// the per-thread scratch's packs, fp32 views of f32/bf16 storage, and the causal limit of each
// query row and the first key of its document and window.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/bf16_gemm.h"
#include "untied/core/dtype.h"
#include "untied/kernels/attention.h"

namespace untied::cpu {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// An AttentionShape with defaults filled in.
struct AttnGeom {
  int64_t sq, sk, h, g, group, d, q_rs, kv_rs, bq, bk, nqb, nkb;
  int64_t q_off, k_off;
  bool causal;
  const int64_t* doc_starts;  // null: one document
  int64_t num_docs, window;
  float scale;
  DType dtype;      // storage of q, k, v, dout
  DType out_dtype;  // storage of out, dq, dk, dv: f32 with f32_results, else dtype
  bool acc_dkv;     // AttentionShape::accumulate_dkv: dk, dv +=
};

inline AttnGeom make_geom(const AttentionShape& s) {
  AttnGeom a{};
  a.sq = s.seq_q;
  a.sk = s.seq_k;
  a.h = s.heads;
  a.g = s.kv_heads;
  a.group = s.heads / s.kv_heads;
  a.d = s.head_dim;
  a.q_rs = s.q_row_stride > 0 ? s.q_row_stride : s.heads * s.head_dim;
  a.kv_rs = s.kv_row_stride > 0 ? s.kv_row_stride : s.kv_heads * s.head_dim;
  // Default tiles 128 x 128; 256 x 256 for bf16 storage on AMX with both sequences at least 2048
  // long, where each packed tile serves twice the rows (S 4096, 8 heads, 2 KV heads, 2 threads:
  // fwd+bwd 827 -> 962 GFLOP/s) and the causal diagonal's wasted half of its tiles stays small.
  // (On the AVX512-BF16 dot-product kernel, 256 x 256 measured the same as 128 x 128.)
  const int64_t tile = s.dtype == DType::kBF16 && bf16_tile_products_on_amx() && s.seq_q >= 2048 && s.seq_k >= 2048
                           ? 256
                           : 128;
  a.bq = s.block_q > 0 ? s.block_q : tile;
  a.bk = s.block_k > 0 ? s.block_k : tile;
  a.nqb = (a.sq + a.bq - 1) / a.bq;
  a.nkb = (a.sk + a.bk - 1) / a.bk;
  a.q_off = s.q_offset;
  a.k_off = s.k_offset;
  a.causal = s.causal;
  a.doc_starts = s.doc_starts;
  a.num_docs = s.num_docs;
  a.window = s.window;
  a.scale = s.scale > 0.0f ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  a.dtype = s.dtype;
  a.out_dtype = s.f32_results ? DType::kF32 : s.dtype;
  a.acc_dkv = s.accumulate_dkv;
  return a;
}

// Whether the tile products run on AMX (amx.h): bf16 storage where bf16 GEMMs run there.
inline bool use_amx(const AttnGeom& a) { return a.dtype == DType::kBF16 && bf16_tile_products_on_amx(); }

// The per-thread scratch's packs, each from a 64-byte boundary: `bf16_elems` bf16 elements (an
// AMX pack) in floats, and `words` uint32 words (a pack of the bf16 dot-product kernel) in words,
// both rounded up to 64 bytes.
inline int64_t floats_of(int64_t bf16_elems) { return (bf16_elems + 31) / 32 * 16; }
inline int64_t words_rounded(int64_t words) { return (words + 15) / 16 * 16; }

// Number of keys (from key row 0) that query row i may see: all of them when not causal.
inline int64_t visible_keys(const AttnGeom& a, int64_t i) {
  if (!a.causal) return a.sk;
  return std::clamp<int64_t>(a.q_off + i - a.k_off + 1, 0, a.sk);
}

// The first key (from key row 0) that query row i may see: past the start of its document and
// the window (sequence_mask.h); 0 without either. Non-decreasing in i.
inline int64_t first_visible_key(const AttnGeom& a, int64_t i) {
  const int64_t p = a.q_off + i;
  int64_t lo = 0;  // a global position
  if (a.doc_starts != nullptr) lo = *(std::upper_bound(a.doc_starts, a.doc_starts + a.num_docs, p) - 1);
  if (a.window > 0) lo = std::max(lo, p - a.window + 1);
  return std::clamp<int64_t>(lo - a.k_off, 0, a.sk);
}
inline bool has_lower_bound(const AttnGeom& a) { return a.doc_starts != nullptr || a.window > 0; }

// `rows` rows of `cols` elements at `src` (row stride `ld` elements, storage `t`) as a dense
// fp32 tile in `scratch` (rows*cols floats): bf16 is widened, f32 copied. Dense, because the
// rows of one head lie H*D apart in a token-major tensor, a power-of-two stride at which a
// GEMM's rows fall into one cache set.
struct F32Rows {
  const float* ptr;
  int64_t ld;
};
inline F32Rows f32_rows(const void* src, DType t, int64_t rows, int64_t cols, int64_t ld, float* scratch) {
  const char* p = static_cast<const char*>(src);
  const int64_t es = dtype_size(t);
  for (int64_t r = 0; r < rows; ++r) load_f32(scratch + r * cols, p + r * ld * es, t, cols);
  return {scratch, cols};
}

// Element pointer (token row, head) in a (rows, heads, D) tensor of storage t.
inline const void* at(const void* base, DType t, int64_t row, int64_t row_stride, int64_t head, int64_t d) {
  return static_cast<const char*>(base) + (row * row_stride + head * d) * dtype_size(t);
}
inline void* at(void* base, DType t, int64_t row, int64_t row_stride, int64_t head, int64_t d) {
  return static_cast<char*>(base) + (row * row_stride + head * d) * dtype_size(t);
}

}  // namespace untied::cpu

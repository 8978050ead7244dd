// Private pieces of the CUDA flash attention (attention_forward.cu, attention_backward.cu):
// the kernel parameters, the tensor-core primitives (mma.sync, ldmatrix, cp.async), the causal
// geometry, and the run-time choice between the two paths:
//
//   tensor-core path: bf16 storage, D in {64, 128}, compute capability >= 8.0, row strides that
//     are multiples of 8 elements and 16-byte aligned tensors (16-byte cp.async copies).
//   portable path: everything else with D <= 256 (f32 storage always: exact fp32 math, no bf16
//     rounding of any operand). D > 256 is refused with ErrorKind::kUnsupported.
//
// Tile sizes are compile-time constants of each kernel; AttentionShape::block_q / block_k are a
// CPU tuning knob and are ignored here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "untied/core/status.h"
#include "untied/kernels/attention.h"

namespace untied::cuda::attn {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
inline constexpr int kMaxPortableDim = 256;

using bf16 = __nv_bfloat16;

// An AttentionShape with the defaults filled in, as the kernels read it.
struct AttnGeom {
  int64_t sq, sk;        // query rows, key rows
  int64_t q_rs, kv_rs;   // row strides (elements) of q/out/dout/dq and k/v/dk/dv
  int64_t diff;          // q_offset - k_offset: when causal, row i sees key j iff j - i <= diff
  int h, g, group, d;    // H, G, H/G, D
  int causal;
  // Documents and window (attention.h): row i also needs keys from first_visible_key(i) on.
  const int64_t* doc_starts;  // device memory, num_docs entries; null: one document
  int64_t num_docs, window;
  int64_t q_off, k_off;
  int has_lo;                 // doc_starts or window set
  float scale;           // softmax scale
  float scale_log2;      // scale * log2(e): scores in base-2 units
};

struct FwdParams {
  AttnGeom a;
  const void* q;
  const void* k;
  const void* v;
  void* out;   // (sq, H, D), row stride q_rs: the storage type, or fp32 when out_f32
  float* lse;  // (H, sq)
  int out_f32 = 0;  // AttentionShape::f32_results
};

struct BwdParams {
  AttnGeom a;
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;    // (H, sq)
  const float* delta;  // (H, sq) = rowsum(dout * out)
  float* dq_acc;       // fp32 dQ accumulator (sq, H, D) with row stride dq_acc_rs
  int64_t dq_acc_rs;
  void* dk;            // (sk, G, D), row stride kv_rs: the storage type, or fp32 when out_f32
  void* dv;
  int out_f32 = 0;     // AttentionShape::f32_results (dk, dv in fp32; dq_acc is then dq itself)
  int acc_dkv = 0;     // AttentionShape::accumulate_dkv (with out_f32: dk, dv +=)
};

inline AttnGeom make_attn_geom(const AttentionShape& s) {
  UNTIED_CHECK(s.heads <= INT32_MAX && s.kv_heads <= INT32_MAX, "cuda attention: heads (", s.heads,
               ") must fit in 32 bits");
  AttnGeom a{};
  a.sq = s.seq_q;
  a.sk = s.seq_k;
  a.h = static_cast<int>(s.heads);
  a.g = static_cast<int>(s.kv_heads);
  a.group = a.h / a.g;
  a.d = static_cast<int>(s.head_dim);
  a.q_rs = s.q_row_stride > 0 ? s.q_row_stride : s.heads * s.head_dim;
  a.kv_rs = s.kv_row_stride > 0 ? s.kv_row_stride : s.kv_heads * s.head_dim;
  a.diff = s.q_offset - s.k_offset;
  a.causal = s.causal ? 1 : 0;
  a.doc_starts = s.doc_starts;
  a.num_docs = s.num_docs;
  a.window = s.window;
  a.q_off = s.q_offset;
  a.k_off = s.k_offset;
  a.has_lo = s.doc_starts != nullptr || s.window > 0 ? 1 : 0;
  // The same float expressions as the CPU kernels (kernels/cpu/attention_tiles.h).
  a.scale = s.scale > 0.0f ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  a.scale_log2 = a.scale * kLog2e;
  return a;
}

// Keys [0, visible_keys(a, i)) are the ones query row i sees.
__host__ __device__ __forceinline__ int64_t visible_keys(const AttnGeom& a, int64_t i) {
  if (!a.causal) return a.sk;
  const int64_t n = a.diff + i + 1;
  return n < 0 ? 0 : (n > a.sk ? a.sk : n);
}

// The first key (from key row 0) that query row i may see: not before its document's start
// (the last of doc_starts at or before its position) nor before its window; 0 without either.
// Non-decreasing in i (the tile skipping relies on it). Reads doc_starts: device code only.
__device__ __forceinline__ int64_t first_visible_key(const AttnGeom& a, int64_t i) {
  if (!a.has_lo) return 0;
  const int64_t p = a.q_off + i;
  int64_t lo = 0;
  if (a.doc_starts != nullptr) {  // doc_starts[l] <= p < doc_starts[r] (r = num_docs: the end)
    int64_t l = 0, r = a.num_docs;
    while (r - l > 1) {
      const int64_t mid = (l + r) / 2;
      if (a.doc_starts[mid] <= p) l = mid;
      else r = mid;
    }
    lo = a.doc_starts[l];
  }
  if (a.window > 0 && p - a.window + 1 > lo) lo = p - a.window + 1;
  lo -= a.k_off;
  return lo < 0 ? 0 : (lo > a.sk ? a.sk : lo);
}

// The end of the query rows that see key j under documents and window: rows in
// [first_row_seeing(j), rows_seeing_end(j)) (the rows whose first visible key is <= j).
__device__ __forceinline__ int64_t rows_seeing_end(const AttnGeom& a, int64_t j) {
  if (!a.has_lo) return a.sq;
  int64_t l = 0, r = a.sq;  // the first row with first_visible_key > j, by bisection
  while (l < r) {
    const int64_t mid = (l + r) / 2;
    if (first_visible_key(a, mid) > j) r = mid;
    else l = mid + 1;
  }
  return l;
}

// The first query row that sees key j (sq when none does).
__host__ __device__ __forceinline__ int64_t first_row_seeing(const AttnGeom& a, int64_t j) {
  if (!a.causal) return 0;
  const int64_t i = j - a.diff;
  return i < 0 ? 0 : (i > a.sq ? a.sq : i);
}

__host__ __device__ __forceinline__ int clamp_to(int64_t x, int hi) {
  return x < 0 ? 0 : (x > hi ? hi : static_cast<int>(x));
}

// The (query tile, head) a forward block works on, from blockIdx.x: heads fastest, query tiles
// longest first (block 0 takes the last tile, which sees the most keys under the causal mask).
// Rows from q0 (kBr of them, fewer in the last tile); nkb = the key tiles any of its rows sees.
struct FwdTile {
  int h, kvh;
  int64_t q0, kb0, nkb;  // key tiles [kb0, nkb): from the first row's first key to the last row's last
};

template <int kBr, int kBc>
__device__ __forceinline__ FwdTile fwd_tile(const AttnGeom& a) {
  const int64_t nqb = (a.sq + kBr - 1) / kBr;
  const int64_t item = blockIdx.x;
  FwdTile t;
  t.h = static_cast<int>(item % a.h);
  t.q0 = (nqb - 1 - item / a.h) * kBr;
  t.kvh = t.h / a.group;
  const int64_t q_last = (t.q0 + kBr < a.sq ? t.q0 + kBr : a.sq) - 1;
  t.nkb = (visible_keys(a, q_last) + kBc - 1) / kBc;
  t.kb0 = first_visible_key(a, t.q0) / kBc;
  if (t.kb0 > t.nkb) t.kb0 = t.nkb;
  return t;
}

// The (key tile, KV head) a backward block works on, from blockIdx.x (KV heads fastest), and its
// steps: each query head of the KV head's GQA group times each query tile of kBr rows that can see
// a key of the tile (from the causal start; with documents and a window, up to the last such row).
struct BwdTile {
  int kvh, group;
  int64_t k0;     // the tile's first key
  int64_t qb0;    // the first query tile that sees any of its keys
  int64_t nq;     // query tiles per head
  int64_t steps;  // nq x group
  __device__ __forceinline__ int head(int64_t t) const { return kvh * group + static_cast<int>(t / nq); }
  __device__ __forceinline__ int64_t q_tile(int64_t t) const { return qb0 + t % nq; }
};

template <int kBr, int kBc>
__device__ __forceinline__ BwdTile bwd_tile(const AttnGeom& a) {
  BwdTile t;
  t.kvh = static_cast<int>(blockIdx.x % a.g);
  t.group = a.group;
  t.k0 = (static_cast<int64_t>(blockIdx.x) / a.g) * kBc;
  const int64_t i_first = first_row_seeing(a, t.k0);  // no earlier query row sees any key of the tile
  // Documents and window: no later row than i_end sees any key of the tile either.
  const int64_t i_end = rows_seeing_end(a, (t.k0 + kBc < a.sk ? t.k0 + kBc : a.sk) - 1);
  t.qb0 = i_first / kBr;
  t.nq = i_first >= i_end ? 0 : (i_end + kBr - 1) / kBr - t.qb0;
  t.steps = t.nq * a.group;
  return t;
}

// ---- PTX primitives (sm_80+) ----
__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char untied_attn_smem[];
  return untied_attn_smem;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through L1; writes zeros instead (and reads
// nothing) when !valid. dst and src 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

// 4 bytes global -> shared (zeros when !valid). dst and src 4-byte aligned.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits for all of this thread's cp.async groups; a __syncthreads() must follow before other
// threads read what they wrote.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, and lane l gets
// row l/4, columns 2(l%4), 2(l%4)+1 of each matrix in r[m].
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// The same, transposed: lane l gets rows 2(l%4), 2(l%4)+1, column l/4 of each matrix.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col). Fragments (g = lane/4, t = lane%4):
//   a[0] (g, 2t..2t+1)  a[1] (g+8, 2t..)  a[2] (g, 2t+8..)  a[3] (g+8, 2t+8..)
//   b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   c[0..1] (g, 2t..2t+1)  c[2..3] (g+8, 2t..2t+1)
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void st_shared_u32(void* p, uint32_t v) { *static_cast<uint32_t*>(p) = v; }

// 2^x in one MUFU.EX2 (ex2.approx.ftz: ~2 ulp; subnormal results flush to 0, as the CPU's
// fast_exp2 does); 2^-inf = 0. exp2f would add the subnormal rescaling around it.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// p[0] += x, p[1] += y (fp32, global memory, p 8-byte aligned): one vector atomic on sm_90.
__device__ __forceinline__ void atomic_add_f32x2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}
// ---- end PTX primitives ----

// Two floats as packed bf16 (round to nearest even); `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 t = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&t);
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void from_f32(float* p, float x) { *p = x; }
__device__ __forceinline__ void from_f32(bf16* p, float x) { *p = __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---- pieces of the tensor-core kernels (mma.sync and wgmma alike) ----
// Their accumulators: per warp 16 rows, each 8-column n-tile laid out as mma.sync's C fragment, so
// a lane holds columns 2 (lane % 4) + {0, 1} (t2 + e) of rows g = lane / 4 and g + 8 (row half hf).
// The helpers take an accessor frag(nt, e) for element e of n-tile nt of one row half.

// The forward's online-softmax step for one row half (query row i) over a key tile of kNT 8-key
// n-tiles from key k0: keys outside what the row sees are masked (when `masked`: the causal end,
// and the row's first visible key row_lo), the row max is taken over the quad sharing the row,
// the scores become p = exp2(s scale log2(e) - m) in place, and m and this lane's partial row sum l
// are updated. Returns alpha, the factor that rescales the row's O.
template <int kNT, typename Frag>
__device__ __forceinline__ float online_softmax_row(Frag&& s, const AttnGeom& a, bool masked, int64_t k0, int64_t i,
                                                    int64_t row_lo, int t2, float& m, float& l) {
  constexpr int kBc = kNT * 8;
  int lo = 0, lim = kBc;  // keys [k0 + lo, k0 + lim) of this tile are visible to the row
  if (masked) {
    lo = clamp_to(row_lo - k0, kBc);
    lim = clamp_to(visible_keys(a, i) - k0, kBc);
  }
  // Row max of the raw scores (scale > 0 keeps the order), then in base-2 units.
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = nt * 8 + t2 + e;
      if (col >= lim || col < lo) s(nt, e) = -INFINITY;
      mx = fmaxf(mx, s(nt, e));
    }
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx * a.scale_log2);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: p = 0, not NaN
  const float alpha = exp2_ftz(m - m_use);
  m = m_new;
  float sum = 0.0f;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float pv = exp2_ftz(fmaf(s(nt, e), a.scale_log2, -m_use));
      s(nt, e) = pv;
      sum += pv;
    }
  }
  l = l * alpha + sum;  // this lane's partial row sum
  return alpha;
}

// The forward's output of query row i, head h, from O's fragments o(dt, e) (kDT 8-column n-tiles),
// the row max m and this lane's partial row sum l: out = O / l (0 for a row that saw no key; NaN
// scores carried), lse = (m + log2 l) ln 2 (-inf for such a row). Every lane of the quad calls it
// (l is summed over the quad); rows >= sq are not written.
template <int kDT, typename Frag>
__device__ __forceinline__ void store_out_row(const FwdParams& p, int64_t i, int h, int t2, int lane, Frag&& o, float m,
                                              float l) {
  const AttnGeom& a = p.a;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (i >= a.sq) return;
  const float inv = l > 0.0f ? 1.0f / l : l == 0.0f ? 0.0f : l;
  const int64_t at = i * a.q_rs + static_cast<int64_t>(h) * kDT * 8 + t2;
  if (p.out_f32) {
    float* orow = static_cast<float*>(p.out) + at;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) *reinterpret_cast<float2*>(orow + dt * 8) = make_float2(o(dt, 0) * inv, o(dt, 1) * inv);
  } else {
    bf16* orow = static_cast<bf16*>(p.out) + at;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) *reinterpret_cast<uint32_t*>(orow + dt * 8) = pack_bf16(o(dt, 0) * inv, o(dt, 1) * inv);
  }
  if ((lane & 3) == 0) p.lse[h * a.sq + i] = l > 0.0f ? (m + log2f(l)) * kLn2 : l == 0.0f ? -INFINITY : l;
}

// The backward's per-row values of query rows [q0, q0 + kBr) of head hq into one stage: lse and
// delta by cp.async (threads [0, kBr) and [kBr, 2 kBr); zeros past sq) and each row's first
// visible key (documents, window).
template <int kBr>
__device__ __forceinline__ void load_row_values_async(const BwdParams& p, int hq, int64_t q0, float* lse, float* delta,
                                                      int* lo, int tid) {
  const AttnGeom& a = p.a;
  const int r = tid < kBr ? tid : tid - kBr;
  const int64_t i = q0 + r;
  const bool valid = i < a.sq;
  const int64_t off = static_cast<int64_t>(hq) * a.sq + (valid ? i : 0);
  if (tid < kBr) {
    cp_async_4(lse + r, p.lse + off, valid);
    lo[r] = static_cast<int>(first_visible_key(a, i));
  } else if (tid < 2 * kBr) {
    cp_async_4(delta + r, p.delta + off, valid);
  }
}

// The backward's dK and dV of key row j at columns col, col + 1 (dk already scaled): stored in the
// storage type, or in fp32 (out_f32), added to what is there (with accumulate_dkv: this block's
// keys are written by this block alone, so there is no race).
__device__ __forceinline__ void store_dkv_pair(const BwdParams& p, int64_t j, int64_t col, float dk0, float dk1,
                                               float dv0, float dv1) {
  const int64_t at = j * p.a.kv_rs + col;
  if (p.out_f32) {
    float* dkp = static_cast<float*>(p.dk) + at;
    float* dvp = static_cast<float*>(p.dv) + at;
    float2 k2 = make_float2(dk0, dk1), v2 = make_float2(dv0, dv1);
    if (p.acc_dkv) {
      const float2 k_old = *reinterpret_cast<const float2*>(dkp);
      const float2 v_old = *reinterpret_cast<const float2*>(dvp);
      k2 = make_float2(__fadd_rn(k_old.x, k2.x), __fadd_rn(k_old.y, k2.y));
      v2 = make_float2(__fadd_rn(v_old.x, v2.x), __fadd_rn(v_old.y, v2.y));
    }
    *reinterpret_cast<float2*>(dkp) = k2;
    *reinterpret_cast<float2*>(dvp) = v2;
    return;
  }
  *reinterpret_cast<uint32_t*>(static_cast<bf16*>(p.dk) + at) = pack_bf16(dk0, dk1);
  *reinterpret_cast<uint32_t*>(static_cast<bf16*>(p.dv) + at) = pack_bf16(dv0, dv1);
}

// Copies rows [row0, row0 + kRows) of one head (kD elements at column col0) of a bf16 tensor
// with row stride rs into a shared tile with row stride kD + 8 (the 16-byte pad makes the eight
// row addresses of each ldmatrix fall in distinct banks). Rows >= nrows are zero-filled.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile_async(bf16* dst, const bf16* src, int64_t row0, int64_t nrows, int64_t rs,
                                                int64_t col0, int tid) {
  constexpr int kChunks = kD / 8;
  constexpr int kTotal = kRows * kChunks;
#pragma unroll
  for (int it = 0; it < (kTotal + kThreads - 1) / kThreads; ++it) {
    const int idx = tid + it * kThreads;
    if (kTotal % kThreads == 0 || idx < kTotal) {
      const int r = idx / kChunks;
      const int c = idx % kChunks;
      const int64_t row = row0 + r;
      const bool valid = row < nrows;
      const bf16* s = valid ? src + row * rs + col0 + c * 8 : src;
      cp_async_16(dst + r * (kD + 8) + c * 8, s, valid);
    }
  }
}

// ---- host side ----

struct DeviceCaps {
  int major = 0;
  int minor = 0;
  int smem_optin = 0;  // bytes of shared memory a block may opt in to
  int sms = 0;
};

// The current device's capabilities, read once per device and cached.
inline DeviceCaps device_caps() {
  int dev = 0;
  UNTIED_CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<int, DeviceCaps> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  DeviceCaps c;
  UNTIED_CUDA_CHECK(cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, dev));
  UNTIED_CUDA_CHECK(cudaDeviceGetAttribute(&c.minor, cudaDevAttrComputeCapabilityMinor, dev));
  UNTIED_CUDA_CHECK(cudaDeviceGetAttribute(&c.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  UNTIED_CUDA_CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev));
  cache.emplace(dev, c);
  return c;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The forward's wgmma kernel (attention_forward_sm90.cu) on a compute capability 9.0 GPU, for
// what use_tensor_cores accepts, where UNTIED_CUDA_ATTENTION=wgmma: launches it and answers true,
// or answers false (not asked for, another GPU, a build without sm_90a code) and launches nothing.
bool attention_forward_sm90(const FwdParams& p, cudaStream_t stream);
// The backward's (attention_backward_sm90.cu; D = 128), likewise.
bool attention_backward_sm90(const BwdParams& p, cudaStream_t stream);

// True when the tensor-core path applies (see the top of this file); `ptrs` are every tensor the
// kernel reads or writes with 16-byte (or 4-byte bf16x2) accesses.
template <typename... Ptrs>
bool use_tensor_cores(const AttnGeom& a, DType t, Ptrs... ptrs) {
  if (t != DType::kBF16 || (a.d != 64 && a.d != 128)) return false;
  if (a.q_rs % 8 != 0 || a.kv_rs % 8 != 0) return false;
  if (!(aligned16(ptrs) && ...)) return false;
  return device_caps().major >= 8;
}

inline Status portable_dim_supported(int64_t head_dim) {
  if (head_dim <= kMaxPortableDim) return Status::ok_status();
  return Status::unsupported(str_cat("head_dim ", head_dim, " (at most ", kMaxPortableDim,
                                     "): use the CPU backend or a smaller head_dim"));
}

// Launch configuration helpers: raises a kernel's dynamic shared memory limit when it needs more
// than the default 48 KB, refusing a device that cannot give it.
template <typename Kernel>
void set_smem(Kernel* kernel, int64_t bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  const DeviceCaps c = device_caps();
  UNTIED_CHECK_KIND(ErrorKind::kUnsupported, bytes <= c.smem_optin, "cuda attention: ", what, " needs ", bytes,
                    " bytes of shared memory per block; this GPU allows ", c.smem_optin);
  UNTIED_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// 1-D grid size for `items` blocks (one block per item).
inline unsigned grid_1d(int64_t items, const char* what) {
  UNTIED_CHECK(items <= INT32_MAX, "cuda attention: ", what, " needs ", items, " blocks (more than 2^31-1)");
  return static_cast<unsigned>(items);
}

// Launches `kernel`(p) with one block of `threads` threads and `smem` bytes of dynamic shared
// memory per (tile, head): ceil(rows / tile_rows) * heads blocks. The forward tiles the queries,
// the backward the keys.
template <typename Kernel, typename Params>
void launch_tiled(Kernel* kernel, int threads, int64_t smem, int64_t rows, int64_t tile_rows, int64_t heads,
                  const Params& p, cudaStream_t stream, const char* what) {
  set_smem(kernel, smem, what);
  const unsigned grid = grid_1d((rows + tile_rows - 1) / tile_rows * heads, what);
  kernel<<<grid, threads, static_cast<size_t>(smem), stream>>>(p);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace untied::cuda::attn

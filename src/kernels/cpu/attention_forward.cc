// Flash attention forward on the CPU (FlashAttention-2 schedule).
//
// Work item = (query head h, query tile). Each item keeps an fp32 accumulator for its tile and
// walks the key tiles it may see, with an online softmax in base 2: the query tile is
// pre-scaled by scale*log2(e), so p = exp2(s - m). The scores are held transposed, S^T (keys,
// queries) = K Q^T, so that the query tile is transposed once per item rather than each key
// tile once per query tile, and the softmax statistics of all query rows advance together in
// vector lanes; O += P V is then a GEMM with A = (S^T)^T. Tile products are tile_gemm (our own
// register-blocked kernel, no BLAS); on bf16 storage both products run on bf16 operands, on the
// bf16 dot-product kernel (bf16_gemm.h) or on AMX (amx.h) where bf16 GEMMs run there, with P
// rounded to bf16 for P V as the GPU kernels do (the products of two bf16 are exact, as the
// widened ones are); items are spread over the device's OpenMP threads.
// Per-thread scratch is independent of the sequence length.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <optional>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/fast_exp2.h"
#include "kernels/cpu/tile_gemm.h"

namespace untied::cpu {

namespace {

// Per thread: the visible key range [lo, lim) of each query row (two int64 each, first, so
// they are aligned), Q^T tile, k and v tiles (bf16 widening; the q tile's widening reuses
// acc), S^T, accumulator, and per query row m, l, the new max, the rescale factor and what
// exp2 subtracts. Rounded up to 64 bytes, so that threads share no cache line.
// With AMX, after those: the packed Q^T (B of S^T), K or P (A of either product), V (B of P V),
// each from a 64-byte boundary.
int64_t amx_q_elems(const AttnGeom& a) { return amx_packed_b_elems(a.d, a.bq); }
int64_t amx_a_elems(const AttnGeom& a) {
  return std::max(amx_packed_a_elems(a.bk, a.d), amx_packed_a_elems(a.bq, a.bk));
}
int64_t amx_v_elems(const AttnGeom& a) { return amx_packed_b_elems(a.bk, a.d); }

// bf16 storage on a CPU with AVX512-BF16: both products on the bf16 dot-product kernel
// (bf16_gemm.h). The packed Q tile lives in the Q^T tile's space and the packed K tile in the K
// tile's, where they fit (tiles of at least 32 queries and 12 keys); P and V have packs of their
// own after the tiles.
bool use_bf16_dot(const AttnGeom& a) {
  return a.dtype == DType::kBF16 && bf16_tile_products_available() && bf16_packed_b_words(a.bq, a.d) <= a.d * a.bq &&
         bf16_packed_a_words(a.bk, a.d) <= a.bk * a.d;
}

int64_t forward_tile_floats(const AttnGeom& a) {
  int64_t n = (4 * a.bq + a.d * a.bq + 2 * a.bk * a.d + a.bk * a.bq + a.bq * a.d + 5 * a.bq + 15) / 16 * 16;
  if (use_amx(a)) n += floats_of(amx_q_elems(a)) + floats_of(amx_a_elems(a)) + floats_of(amx_v_elems(a));
  if (use_bf16_dot(a)) n += words_rounded(bf16_packed_a_words(a.bq, a.bk)) + words_rounded(bf16_packed_b_words(a.d, a.bk));
  return n;
}
enum ForwardScratch { kTiles };

}  // namespace

ScratchRequest attention_forward_scratch(const Device& dev, const AttentionForwardCall& c) {
  ScratchRequest r;
  r.set(kTiles, forward_tile_floats(make_geom(c.s)) * dev.threads() * 4, Tag::kAttnWorkspace,
        "attention forward tiles");
  return r;
}

}  // namespace untied::cpu

namespace untied {

int64_t cpu_attention_forward_scratch_bytes(const AttentionShape& s, int threads) {
  return cpu::forward_tile_floats(cpu::make_geom(s)) * threads * 4;
}

}  // namespace untied

namespace untied::cpu {

void attention_forward(Device& dev, const AttentionForwardCall& c, const Scratch& scratch) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& shape = c.s;
  const auto& out = c.t.out;
  const auto& lse = c.t.lse;
  const auto& q = c.t.q;
  const auto& k = c.t.k;
  const auto& v = c.t.v;
  const AttnGeom a = make_geom(shape);
  const int threads = dev.threads();
  const int64_t per_thread = forward_tile_floats(a);
  const float qscale = a.scale * kLog2e;
  const int64_t items = a.h * a.nqb;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const bool bf16_dot = use_bf16_dot(a);
  const bool amx = use_amx(a);

#pragma omp parallel num_threads(threads)
  {
    std::optional<AmxTiles> tiles;
    if (amx) tiles.emplace();
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t h = item % a.h;
      const int64_t qb = item / a.h;
      const int64_t kvh = h / a.group;
      const int64_t q0 = qb * a.bq;
      const int64_t nq = std::min(a.bq, a.sq - q0);

      float* base = scratch.as<float>(kTiles) + per_thread * omp_get_thread_num();
      int64_t* lo = reinterpret_cast<int64_t*>(base);  // visible keys [lo, lim) per query row
      int64_t* lim = lo + a.bq;
      float* qt = base + 4 * a.bq;      // (D, nq): Q^T, scaled
      float* kt = qt + a.d * a.bq;      // (nk, D), bf16 widened
      float* vt = kt + a.bk * a.d;      // (nk, D), bf16 widened
      float* st = vt + a.bk * a.d;      // (nk, nq): S^T, then P^T
      float* acc = st + a.bk * a.bq;    // (nq, D)
      float* m = acc + a.bq * a.d;      // running max per query row
      float* l = m + a.bq;              // running sum
      float* mnew = l + a.bq;
      float* alpha = mnew + a.bq;
      float* sub = alpha + a.bq;        // what exp2 subtracts: mnew, or 0 for a row with nothing visible
      // The bf16 kernels' packs, after the tiles from a 64-byte boundary (one path's, or none).
      float* const packs = base + (sub + a.bq - base + 15) / 16 * 16;
      // AMX.
      uint16_t* q_pack = reinterpret_cast<uint16_t*>(packs);
      uint16_t* a_pack = q_pack + floats_of(amx_q_elems(a)) * 2;
      uint16_t* v_pack = a_pack + floats_of(amx_a_elems(a)) * 2;
      // Dot-product kernel: P as A, V as B of P V.
      uint32_t* p_words = reinterpret_cast<uint32_t*>(packs);
      uint32_t* v_words = p_words + words_rounded(bf16_packed_a_words(a.bq, a.bk));

      if (amx) {  // Q^T packed from the stored bf16; the scale is applied to the products
        amx_pack_bt(q_pack, static_cast<const uint16_t*>(at(q, a.dtype, q0, a.q_rs, h, a.d)), a.q_rs, a.d, nq);
      } else if (bf16_dot) {  // the query tile packed as bf16 pairs; the scale is applied to the products
        bf16_pack_b(reinterpret_cast<uint32_t*>(qt), static_cast<const uint16_t*>(at(q, a.dtype, q0, a.q_rs, h, a.d)),
                    a.q_rs, nq, a.d);
      } else {  // scaled query tile, transposed (the widening of bf16 rows borrows acc)
        const F32Rows qr = f32_rows(at(q, a.dtype, q0, a.q_rs, h, a.d), a.dtype, nq, a.d, a.q_rs, acc);
        transpose_tile(qt, nq, qr.ptr, qr.ld, nq, a.d);
        for (int64_t x = 0; x < a.d * nq; ++x) qt[x] *= qscale;
      }
      std::fill(acc, acc + nq * a.d, 0.0f);
      std::fill(m, m + nq, neg_inf);
      std::fill(l, l + nq, 0.0f);
      for (int64_t i = 0; i < nq; ++i) {
        lo[i] = first_visible_key(a, q0 + i);
        lim[i] = visible_keys(a, q0 + i);
      }

      // Keys [k_begin, k_end): from the first row's first key to the last row's last one.
      const int64_t k_begin = first_visible_key(a, q0), k_end = visible_keys(a, q0 + nq - 1);
      for (int64_t k0 = k_begin; k0 < k_end; k0 += a.bk) {
        const int64_t nk = std::min(a.bk, a.sk - k0);
        const auto* k_rows = static_cast<const uint16_t*>(at(k, a.dtype, k0, a.kv_rs, kvh, a.d));
        const auto* v_rows = static_cast<const uint16_t*>(at(v, a.dtype, k0, a.kv_rs, kvh, a.d));
        // V widened (the bf16 kernels pack it from the stored bf16 instead).
        const F32Rows vr = amx || bf16_dot ? F32Rows{nullptr, 0} : f32_rows(v_rows, a.dtype, nk, a.d, a.kv_rs, vt);
        // st (nk, nq) = K Q^T, in log2 units.
        if (amx) {
          // Unscaled, so that whole tiles are stored straight into st; scaled with the maxima below.
          // K's rows read in place where whole tiles allow, else packed.
          if (amx_rows_in_place(nk, a.d, a.kv_rs)) {
            amx_tile_product_rows(nk, nq, a.d, 1.0f, k_rows, a.kv_rs, q_pack, 0.0f, st, nq);
          } else {
            amx_pack_a(a_pack, k_rows, a.kv_rs, nk, a.d);
            amx_tile_product(nk, nq, a.d, 1.0f, a_pack, q_pack, 0.0f, st, nq);
          }
        } else if (bf16_dot) {
          bf16_pack_a(reinterpret_cast<uint32_t*>(kt), k_rows, a.kv_rs, nk, a.d);
          bf16_tile_gemm(nk, nq, a.d, qscale, reinterpret_cast<const uint32_t*>(kt),
                         reinterpret_cast<const uint32_t*>(qt), false, st, nq);
        } else {
          const F32Rows kr = f32_rows(at(k, a.dtype, k0, a.kv_rs, kvh, a.d), a.dtype, nk, a.d, a.kv_rs, kt);
          tile_gemm(false, nk, nq, a.d, 1.0f, kr.ptr, kr.ld, qt, nq, 0.0f, st, nq);
        }
        const bool needs_mask = (a.causal && visible_keys(a, q0) < k0 + nk) ||
                                (has_lower_bound(a) && first_visible_key(a, q0 + nq - 1) > k0);
        if (needs_mask) {
          for (int64_t j = 0; j < nk; ++j) {
            float* srow = st + j * nq;
            const int64_t key = k0 + j;
#pragma omp simd
            for (int64_t i = 0; i < nq; ++i) srow[i] = key >= lo[i] && key < lim[i] ? srow[i] : neg_inf;
          }
        }
        // New row maxima (max skips NaN scores); on AMX the scores are scaled here (the same
        // product, alpha * sum, as a scaling product makes; the mask's -inf stays -inf).
        std::copy(m, m + nq, mnew);
        for (int64_t j = 0; j < nk; ++j) {
          float* srow = st + j * nq;
          if (amx) {
#pragma omp simd
            for (int64_t i = 0; i < nq; ++i) srow[i] *= qscale;
          }
#pragma omp simd
          for (int64_t i = 0; i < nq; ++i) mnew[i] = srow[i] > mnew[i] ? srow[i] : mnew[i];
        }
        // A row that has seen nothing yet has only -inf or NaN scores: a NaN input must give a
        // NaN output, so l becomes NaN, and the scores become -inf (p = 0).
        bool empty_row = false;
        for (int64_t i = 0; i < nq; ++i) empty_row = empty_row || mnew[i] == neg_inf;
        if (empty_row) {
          for (int64_t i = 0; i < nq; ++i) {
            if (mnew[i] != neg_inf) continue;
            for (int64_t j = 0; j < nk; ++j) {
              float& s = st[j * nq + i];
              if (s != s) l[i] = std::numeric_limits<float>::quiet_NaN();
              s = neg_inf;
            }
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < nq; ++i) {
          const bool none = mnew[i] == neg_inf;
          sub[i] = none ? 0.0f : mnew[i];
          alpha[i] = none ? 1.0f : fast_exp2(m[i] - mnew[i]);
          l[i] *= alpha[i];
          m[i] = mnew[i];
        }
        // P^T = exp2(S^T - m), and l += its column sums (keys in increasing order).
        for (int64_t j = 0; j < nk; ++j) {
          float* srow = st + j * nq;
#pragma omp simd
          for (int64_t i = 0; i < nq; ++i) {
            const float p = fast_exp2(srow[i] - sub[i]);
            srow[i] = p;
            l[i] += p;
          }
        }
        for (int64_t i = 0; i < nq; ++i) {
          if (alpha[i] == 1.0f) continue;
          float* arow = acc + i * a.d;
#pragma omp simd
          for (int64_t x = 0; x < a.d; ++x) arow[x] *= alpha[i];
        }
        // acc (nq, D) += P (nq, nk) V (nk, D), with P = (P^T)^T.
        if (amx) {
          amx_pack_a(a_pack, true, st, nq, nq, nk);
          amx_pack_b(v_pack, v_rows, a.kv_rs, nk, a.d);
          amx_tile_product(nq, a.d, nk, 1.0f, a_pack, v_pack, 1.0f, acc, a.d);
        } else if (bf16_dot) {
          bf16_pack_a_f32(p_words, /*trans_a=*/true, st, nq, nq, nk);
          bf16_pack_bt(v_words, v_rows, a.kv_rs, a.d, nk);
          bf16_tile_gemm(nq, a.d, nk, 1.0f, p_words, v_words, /*accumulate=*/true, acc, a.d);
        } else {
          tile_gemm(true, nq, a.d, nk, 1.0f, st, nq, vr.ptr, vr.ld, 1.0f, acc, a.d);
        }
      }

      for (int64_t i = 0; i < nq; ++i) {
        // l = 0: a row that sees no key (output 0); l NaN: NaN scores, which must not read as masked.
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : l[i] == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        float* arow = acc + i * a.d;
        for (int64_t x = 0; x < a.d; ++x) arow[x] *= inv;
        store_f32(at(out, a.out_dtype, q0 + i, a.q_rs, h, a.d), a.out_dtype, arow, a.d);
        lse[h * a.sq + q0 + i] = l[i] > 0.0f ? (m[i] + std::log2(l[i])) * kLn2 : l[i] == 0.0f ? neg_inf : l[i];
      }
    }
  }
}

}  // namespace untied::cpu

namespace untied::cpu {

// The log-sum-exp merge (attention.h), row-parallel; exp/log in double, so a merge of one result
// with an empty one (lse -inf) copies it exactly.
void attention_merge(Device& dev, const AttentionMergeCall& c, const Scratch&) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& s = c.s;
  const auto& acc = c.t.acc;
  const auto& lse_acc = c.t.lse_acc;
  const auto& part = c.t.part;
  const auto& lse_part = c.t.lse_part;
  const int64_t items = s.rows * s.heads;
#pragma omp parallel for schedule(static) num_threads(dev.threads())
  for (int64_t item = 0; item < items; ++item) {
    const int64_t i = item / s.heads, h = item % s.heads;
    float& la = lse_acc[h * s.lse_acc_stride + i];
    const float lb = lse_part[h * s.lse_part_stride + i];
    if (lb == -std::numeric_limits<float>::infinity()) continue;  // the part saw no key
    float* a = acc + i * s.acc_row_stride + h * s.head_dim;
    const float* b = part + i * s.part_row_stride + h * s.head_dim;
    if (la == -std::numeric_limits<float>::infinity()) {
      std::copy(b, b + s.head_dim, a);
      la = lb;
      continue;
    }
    const double m = std::max<double>(la, lb);
    const double ea = std::exp(static_cast<double>(la) - m), eb = std::exp(static_cast<double>(lb) - m);
    const double sum = ea + eb;
    const float wa = static_cast<float>(ea / sum), wb = static_cast<float>(eb / sum);
    for (int64_t x = 0; x < s.head_dim; ++x) a[x] = wa * a[x] + wb * b[x];
    la = static_cast<float>(m + std::log(sum));
  }
}

}  // namespace untied::cpu

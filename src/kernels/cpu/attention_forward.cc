// Flash attention forward on the CPU (FlashAttention-2 schedule).
//
// Work item = (query head h, query tile). Each item keeps an fp32 accumulator for its tile and
// walks the key tiles it may see, with an online softmax in base 2: the query tile is
// pre-scaled by scale*log2(e), so p = exp2(s - m). Tile products are BLAS sgemm calls on
// fp32 tiles; items are spread over the device's OpenMP threads, inside which OpenBLAS runs
// single-threaded. Per-thread scratch is independent of the sequence length.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/fast_exp2.h"
#include "kernels/cpu/sgemm.h"

namespace untied::cpu {

namespace {

// Per thread: q tile, k and v tiles (bf16 widening), scores, accumulator, m and l.
int64_t forward_tile_floats(const AttnGeom& a) {
  return a.bq * a.d + 2 * a.bk * a.d + a.bq * a.bk + a.bq * a.d + 2 * a.bq;
}
enum ForwardScratch { kTiles };

}  // namespace

ScratchRequest attention_forward_scratch(const Device& dev, const AttentionForwardCall& c) {
  ScratchRequest r;
  r.set(kTiles, forward_tile_floats(make_geom(c.s)) * dev.threads() * 4, Tag::kAttnWorkspace,
        "attention forward tiles");
  return r;
}

void attention_forward(Device& dev, const AttentionForwardCall& c, const Scratch& scratch) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& shape = c.s;
  const auto& out = c.out;
  const auto& lse = c.lse;
  const auto& q = c.q;
  const auto& k = c.k;
  const auto& v = c.v;
  const AttnGeom a = make_geom(shape);
  const int threads = dev.threads();
  const int64_t per_thread = forward_tile_floats(a);
  const float qscale = a.scale * kLog2e;
  const int64_t items = a.h * a.nqb;
  const float neg_inf = -std::numeric_limits<float>::infinity();

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t h = item % a.h;
    const int64_t qb = item / a.h;
    const int64_t kvh = h / a.group;
    const int64_t q0 = qb * a.bq;
    const int64_t nq = std::min(a.bq, a.sq - q0);

    float* base = scratch.as<float>(kTiles) + per_thread * omp_get_thread_num();
    float* qt = base;
    float* kt = qt + a.bq * a.d;
    float* vt = kt + a.bk * a.d;
    float* st = vt + a.bk * a.d;
    float* acc = st + a.bq * a.bk;
    float* m = acc + a.bq * a.d;
    float* l = m + a.bq;

    // Scaled query tile in fp32.
    for (int64_t i = 0; i < nq; ++i) {
      load_f32(qt + i * a.d, at(q, a.dtype, q0 + i, a.q_rs, h, a.d), a.dtype, a.d);
      for (int64_t c = 0; c < a.d; ++c) qt[i * a.d + c] *= qscale;
    }
    std::fill(acc, acc + nq * a.d, 0.0f);
    std::fill(m, m + nq, neg_inf);
    std::fill(l, l + nq, 0.0f);

    // Keys [k_begin, k_end): from the first row's first key to the last row's last one.
    const int64_t k_begin = first_visible_key(a, q0), k_end = visible_keys(a, q0 + nq - 1);
    for (int64_t k0 = k_begin; k0 < k_end; k0 += a.bk) {
      const int64_t nk = std::min(a.bk, a.sk - k0);
      const F32Rows kr = f32_rows(at(k, a.dtype, k0, a.kv_rs, kvh, a.d), a.dtype, nk, a.d, a.kv_rs, kt);
      const F32Rows vr = f32_rows(at(v, a.dtype, k0, a.kv_rs, kvh, a.d), a.dtype, nk, a.d, a.kv_rs, vt);
      // st (nq, nk) = qt kt^T, in log2 units.
      sgemm(false, true, nq, nk, a.d, 1.0f, qt, a.d, kr.ptr, kr.ld, 0.0f, st, nk);
      const bool needs_mask = (a.causal && visible_keys(a, q0) < k0 + nk) ||
                              (has_lower_bound(a) && first_visible_key(a, q0 + nq - 1) > k0);
      for (int64_t i = 0; i < nq; ++i) {
        float* srow = st + i * nk;
        if (needs_mask) {  // keys [lo, lim) of this tile
          const int64_t lo = std::clamp<int64_t>(first_visible_key(a, q0 + i) - k0, 0, nk);
          const int64_t lim = std::clamp<int64_t>(visible_keys(a, q0 + i) - k0, lo, nk);
          for (int64_t j = 0; j < lo; ++j) srow[j] = neg_inf;
          for (int64_t j = lim; j < nk; ++j) srow[j] = neg_inf;
        }
        const float mx = row_max(srow, nk, m[i]);
        if (mx == neg_inf) {  // nothing visible yet in this row (or NaN scores, which max skips)
          bool nan = false;
          for (int64_t j = 0; j < nk; ++j) {
            nan = nan || srow[j] != srow[j];
            srow[j] = 0.0f;
          }
          if (nan) l[i] = std::numeric_limits<float>::quiet_NaN();  // a NaN input gives a NaN output
          continue;
        }
        const float sum = exp2_shift_row(srow, nk, mx);
        const float alpha = fast_exp2(m[i] - mx);
        l[i] = l[i] * alpha + sum;
        m[i] = mx;
        if (alpha != 1.0f) {
          float* arow = acc + i * a.d;
          for (int64_t c = 0; c < a.d; ++c) arow[c] *= alpha;
        }
      }
      // acc (nq, D) += P (nq, nk) V (nk, D).
      sgemm(false, false, nq, a.d, nk, 1.0f, st, nk, vr.ptr, vr.ld, 1.0f, acc, a.d);
    }

    for (int64_t i = 0; i < nq; ++i) {
      // l = 0: a row that sees no key (output 0); l NaN: NaN scores, which must not read as masked.
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : l[i] == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      float* arow = acc + i * a.d;
      for (int64_t c = 0; c < a.d; ++c) arow[c] *= inv;
      store_f32(at(out, a.out_dtype, q0 + i, a.q_rs, h, a.d), a.out_dtype, arow, a.d);
      lse[h * a.sq + q0 + i] = l[i] > 0.0f ? (m[i] + std::log2(l[i])) * kLn2 : l[i] == 0.0f ? neg_inf : l[i];
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
  const auto& acc = c.acc;
  const auto& lse_acc = c.lse_acc;
  const auto& part = c.part;
  const auto& lse_part = c.lse_part;
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

// Flash attention backward on the CPU (FlashAttention-2 algorithm).
//
// 1. D_i = rowsum(dO_i * O_i) per query row and head, into workspace (H, seq_q), unless the
//    caller passes it.
// 2. Work item = (KV head, key tile). For each query head of the KV group and each query tile
//    that can see the key tile, recompute P = exp(S - lse) and accumulate
//        dV += P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dK += scale dS^T Q,
//        dQ += scale dS K.
//    dK and dV of the tile stay in per-thread fp32 accumulators and are written once. K^T and
//    V^T of the tile are packed once per item, so that every product is a tile_gemm (our own
//    register-blocked kernel, no BLAS) with B read row by row; on bf16 storage all five
//    products run on bf16 operands, on the bf16 dot-product kernel (bf16_gemm.h) or on AMX
//    (amx.h) where bf16 GEMMs run there, with P and dS rounded to bf16 for theirs, as the GPU
//    kernels do.
// 3. dQ is accumulated in fp32: thread 0 writes to the main accumulator (dq itself when it is
//    f32, else a workspace), other threads to private ones that are added in thread order at
//    the end. Work is assigned statically, so results are deterministic for a given thread
//    count.
// No (seq_q, seq_k) matrix is ever held; workspace is linear in seq_q.
#include <omp.h>

#include <cmath>
#include <cstring>
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

// Per thread: k, v tiles; K^T, V^T; dk, dv accumulators; q, dO tiles; S/P, dP. Rounded up to
// 64 bytes, so that threads share no cache line.
// With AMX, after those: K^T and V^T packed as B (of P and dP), K as B (of dQ), one A pack (Q,
// dO, P^T, dS^T or dS) and one B pack (dO or Q), each from a 64-byte boundary.
int64_t amx_kt_elems(const AttnGeom& a) { return amx_packed_b_elems(a.d, a.bk); }
int64_t amx_k_elems(const AttnGeom& a) { return amx_packed_b_elems(a.bk, a.d); }
int64_t amx_a_elems(const AttnGeom& a) {
  return std::max({amx_packed_a_elems(a.bq, a.d), amx_packed_a_elems(a.bk, a.bq), amx_packed_a_elems(a.bq, a.bk)});
}
int64_t amx_b_elems(const AttnGeom& a) { return amx_packed_b_elems(a.bq, a.d); }

// bf16 storage on a CPU with AVX512-BF16: all five products on the bf16 dot-product kernel
// (bf16_gemm.h). The packed K and V tiles (B of P and dP) live in the K^T and V^T tiles' space,
// the packed Q or dO tile (A of those) in the V tile's, where they fit (tiles of at least 32
// keys); after the tiles, K as B of dQ, one A pack (P^T, dS^T or dS) and one B pack (dO or Q).
bool use_bf16_dot(const AttnGeom& a) {
  return a.dtype == DType::kBF16 && bf16_tile_products_available() && bf16_packed_b_words(a.bk, a.d) <= a.bk * a.d &&
         bf16_packed_a_words(a.bq, a.d) <= a.bk * a.d;
}
int64_t dot_k_words(const AttnGeom& a) { return words_rounded(bf16_packed_b_words(a.d, a.bk)); }
int64_t dot_a_words(const AttnGeom& a) {
  return words_rounded(std::max(bf16_packed_a_words(a.bk, a.bq), bf16_packed_a_words(a.bq, a.bk)));
}
int64_t dot_b_words(const AttnGeom& a) { return words_rounded(bf16_packed_b_words(a.d, a.bq)); }

int64_t backward_tile_floats(const AttnGeom& a) {
  int64_t n = (6 * a.bk * a.d + 2 * a.bq * a.d + 2 * a.bq * a.bk + 15) / 16 * 16;
  if (use_amx(a))
    n += 2 * floats_of(amx_kt_elems(a)) + floats_of(amx_k_elems(a)) + floats_of(amx_a_elems(a)) +
         floats_of(amx_b_elems(a));
  if (use_bf16_dot(a)) n += dot_k_words(a) + dot_a_words(a) + dot_b_words(a);
  return n;
}
// dQ accumulators beyond dq itself: one per thread but the first, plus the first's when dq is bf16.
int extra_dq_accumulators(const AttnGeom& a, int threads) { return threads - 1 + (a.out_dtype == DType::kF32 ? 0 : 1); }
enum BackwardScratch { kDelta, kDqAccs, kTiles };

}  // namespace

ScratchRequest attention_backward_scratch(const Device& dev, const AttentionBackwardCall& c) {
  const CpuAttentionBackwardScratch b =
      cpu_attention_backward_scratch_bytes(c.s, c.delta_source == DeltaSource::kFromOut, dev.threads());
  ScratchRequest r;
  if (b.delta > 0) r.set(kDelta, b.delta, Tag::kAttnWorkspace, "attention backward D");
  r.set(kDqAccs, b.dq_accumulators, Tag::kAttnWorkspace, "attention backward dQ accumulators");
  r.set(kTiles, b.tiles, Tag::kAttnWorkspace, "attention backward tiles");
  return r;
}

}  // namespace untied::cpu

namespace untied {

CpuAttentionBackwardScratch cpu_attention_backward_scratch_bytes(const AttentionShape& s, bool delta_from_out,
                                                                 int threads) {
  const cpu::AttnGeom a = cpu::make_geom(s);
  return {.delta = delta_from_out ? a.h * a.sq * 4 : 0,
          .dq_accumulators = cpu::extra_dq_accumulators(a, threads) * a.sq * a.h * a.d * 4,
          .tiles = cpu::backward_tile_floats(a) * threads * 4};
}

}  // namespace untied

namespace untied::cpu {

void attention_backward(Device& dev, const AttentionBackwardCall& c, const Scratch& scratch) {
  // The call's fields by name (clang before 16 cannot capture structured bindings in OpenMP regions).
  const auto& shape = c.s;
  const auto& dq = c.t.dq;
  const auto& dk = c.t.dk;
  const auto& dv = c.t.dv;
  const auto& q = c.t.q;
  const auto& k = c.t.k;
  const auto& v = c.t.v;
  const auto& delta_source = c.delta_source;
  const auto& out = c.t.out;
  const auto& delta_given = c.t.delta;
  const auto& lse = c.t.lse;
  const auto& dout = c.t.dout;
  const AttnGeom a = make_geom(shape);
  const int threads = dev.threads();
  const int64_t hd = a.h * a.d;  // elements of one token row of dQ accumulators
  const bool own_delta = delta_source == DeltaSource::kFromOut;
  const bool dq_direct = a.out_dtype == DType::kF32;
  const int64_t per_thread = backward_tile_floats(a);
  float* const delta_buf = scratch.as<float>(kDelta);
  float* const dq_acc_buf = scratch.as<float>(kDqAccs);
  const float* delta = own_delta ? delta_buf : delta_given;
  // dQ accumulator of thread t: row stride acc_rs.
  auto dq_acc = [&](int t, int64_t& acc_rs) -> float* {
    if (dq_direct && t == 0) {
      acc_rs = a.q_rs;
      return static_cast<float*>(dq);
    }
    acc_rs = hd;
    const int slot = dq_direct ? t - 1 : t;
    return dq_acc_buf + static_cast<int64_t>(slot) * a.sq * hd;
  };

  // Step 1: D and zeroed accumulators.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < a.sq; ++i) {
    for (int64_t h = 0; own_delta && h < a.h; ++h)
      delta_buf[h * a.sq + i] =
          dot_f32(at(out, a.dtype, i, a.q_rs, h, a.d), at(dout, a.dtype, i, a.q_rs, h, a.d), a.dtype, a.d);
    for (int t = 0; t < threads; ++t) {
      int64_t rs;
      float* acc = dq_acc(t, rs);
      std::memset(acc + i * rs, 0, static_cast<size_t>(hd) * 4);
    }
  }

  const float s2 = a.scale * kLog2e;  // scores in log2 units
  const bool bf16_dot = use_bf16_dot(a);
  const bool amx = use_amx(a);
  const int64_t items = a.g * a.nkb;

  // Step 2. schedule(static, 1): deterministic assignment; round-robin balances causal work.
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    int64_t acc_rs;
    float* dq_mine = dq_acc(t, acc_rs);
    float* base = scratch.as<float>(kTiles) + per_thread * t;
    float* kt = base;
    float* vt = kt + a.bk * a.d;
    float* ktt = vt + a.bk * a.d;  // (D, nk)
    float* vtt = ktt + a.bk * a.d;  // (D, nk)
    float* dkt = vtt + a.bk * a.d;
    float* dvt = dkt + a.bk * a.d;
    float* qt = dvt + a.bk * a.d;
    float* dot = qt + a.bq * a.d;
    float* pt = dot + a.bq * a.d;
    float* dpt = pt + a.bq * a.bk;
    // The bf16 kernels' packs, after the tiles from a 64-byte boundary (one path's, or none).
    float* const packs = base + (dpt + a.bq * a.bk - base + 15) / 16 * 16;
    // AMX.
    uint16_t* kt_pack = reinterpret_cast<uint16_t*>(packs);
    uint16_t* vt_pack = kt_pack + floats_of(amx_kt_elems(a)) * 2;
    uint16_t* k_pack = vt_pack + floats_of(amx_kt_elems(a)) * 2;
    uint16_t* a_pack = k_pack + floats_of(amx_k_elems(a)) * 2;
    uint16_t* b_pack = a_pack + floats_of(amx_a_elems(a)) * 2;
    // Dot-product kernel.
    uint32_t* k_words = reinterpret_cast<uint32_t*>(packs);
    uint32_t* a_words = k_words + dot_k_words(a);
    uint32_t* b_words = a_words + dot_a_words(a);
    std::optional<AmxTiles> tiles;
    if (amx) tiles.emplace();

#pragma omp for schedule(static, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t kvh = item % a.g;
      const int64_t kb = item / a.g;
      const int64_t k0 = kb * a.bk;
      const int64_t nk = std::min(a.bk, a.sk - k0);
      const auto* k_rows = static_cast<const uint16_t*>(at(k, a.dtype, k0, a.kv_rs, kvh, a.d));
      // K widened (the bf16 kernels pack the stored bf16 instead).
      const F32Rows kr = amx || bf16_dot ? F32Rows{nullptr, 0} : f32_rows(k_rows, a.dtype, nk, a.d, a.kv_rs, kt);
      if (amx) {  // K^T, V^T and K packed as B of the products with Q, dO and dS
        amx_pack_bt(kt_pack, k_rows, a.kv_rs, a.d, nk);
        amx_pack_bt(vt_pack, static_cast<const uint16_t*>(at(v, a.dtype, k0, a.kv_rs, kvh, a.d)), a.kv_rs, a.d, nk);
        amx_pack_b(k_pack, k_rows, a.kv_rs, nk, a.d);
      } else if (bf16_dot) {  // K and V packed as B of the products with Q and dO, K as B of dQ's
        bf16_pack_b(reinterpret_cast<uint32_t*>(ktt), k_rows, a.kv_rs, nk, a.d);
        bf16_pack_b(reinterpret_cast<uint32_t*>(vtt), static_cast<const uint16_t*>(at(v, a.dtype, k0, a.kv_rs, kvh, a.d)),
                    a.kv_rs, nk, a.d);
        bf16_pack_bt(k_words, k_rows, a.kv_rs, a.d, nk);
      } else {
        const F32Rows vr = f32_rows(at(v, a.dtype, k0, a.kv_rs, kvh, a.d), a.dtype, nk, a.d, a.kv_rs, vt);
        transpose_tile(ktt, nk, kr.ptr, kr.ld, nk, a.d);
        transpose_tile(vtt, nk, vr.ptr, vr.ld, nk, a.d);
      }
      // The packed Q or dO tile of a product (in the V tile's space, unused then).
      uint32_t* const rows_packed = reinterpret_cast<uint32_t*>(vt);
      std::fill(dkt, dkt + nk * a.d, 0.0f);
      std::fill(dvt, dvt + nk * a.d, 0.0f);

      // First query row that sees key k0: visible_keys(i) > k0  <=>  q_off + i - k_off >= k0.
      int64_t i_first = 0;
      if (a.causal) i_first = std::clamp<int64_t>(a.k_off + k0 - a.q_off, 0, a.sq);
      for (int64_t hq = kvh * a.group; hq < (kvh + 1) * a.group; ++hq) {
        for (int64_t q0 = (i_first / a.bq) * a.bq; q0 < a.sq; q0 += a.bq) {
          // Documents and window: once a tile's first row starts after this key tile, so do all later ones.
          if (has_lower_bound(a) && first_visible_key(a, q0) >= k0 + nk) break;
          const int64_t nq = std::min(a.bq, a.sq - q0);
          const auto* q_rows = static_cast<const uint16_t*>(at(q, a.dtype, q0, a.q_rs, hq, a.d));
          const auto* do_rows = static_cast<const uint16_t*>(at(dout, a.dtype, q0, a.q_rs, hq, a.d));
          // Q and dO widened (the bf16 kernels pack the stored bf16 instead).
          const bool widen = !amx && !bf16_dot;
          const F32Rows qr = widen ? f32_rows(q_rows, a.dtype, nq, a.d, a.q_rs, qt) : F32Rows{nullptr, 0};
          const F32Rows dor = widen ? f32_rows(do_rows, a.dtype, nq, a.d, a.q_rs, dot) : F32Rows{nullptr, 0};
          // P (nq, nk) = exp2(s2 * Q K^T - lse*log2e), masked.
          // On AMX, Q's and dO's rows are read in place where whole tiles allow, else packed.
          const bool in_place = amx && amx_rows_in_place(nq, a.d, a.q_rs);
          if (amx) {
            // Unscaled, so that whole tiles are stored straight into pt; scaled in the exp below.
            if (in_place) {
              amx_tile_product_rows(nq, nk, a.d, 1.0f, q_rows, a.q_rs, kt_pack, 0.0f, pt, nk);
            } else {
              amx_pack_a(a_pack, q_rows, a.q_rs, nq, a.d);
              amx_tile_product(nq, nk, a.d, 1.0f, a_pack, kt_pack, 0.0f, pt, nk);
            }
          } else if (bf16_dot) {
            bf16_pack_a(rows_packed, q_rows, a.q_rs, nq, a.d);
            bf16_tile_gemm(nq, nk, a.d, s2, rows_packed, reinterpret_cast<const uint32_t*>(ktt), false, pt, nk);
          } else {
            tile_gemm(false, nq, nk, a.d, s2, qr.ptr, qr.ld, ktt, nk, 0.0f, pt, nk);
          }
          const bool needs_mask = (a.causal && visible_keys(a, q0) < k0 + nk) ||
                                  (has_lower_bound(a) && first_visible_key(a, q0 + nq - 1) > k0);
          const float post_scale = amx ? s2 : 1.0f;  // x * 1.0f is x, NaN and -inf included
          for (int64_t i = 0; i < nq; ++i) {
            float* prow = pt + i * nk;
            const float l2 = lse[hq * a.sq + q0 + i] * kLog2e;
            // Keys [lo, lim) of this tile.
            const int64_t lo = needs_mask ? std::clamp<int64_t>(first_visible_key(a, q0 + i) - k0, 0, nk) : 0;
            const int64_t lim = needs_mask ? std::clamp<int64_t>(visible_keys(a, q0 + i) - k0, lo, nk) : nk;
            if (l2 == -std::numeric_limits<float>::infinity()) {
              std::fill(prow, prow + nk, 0.0f);
              continue;
            }
            for (int64_t j = 0; j < lo; ++j) prow[j] = 0.0f;
#pragma omp simd
            for (int64_t j = lo; j < lim; ++j) prow[j] = fast_exp2(prow[j] * post_scale - l2);
            for (int64_t j = lim; j < nk; ++j) prow[j] = 0.0f;
          }
          // dV (nk, D) += P^T dO.
          if (amx) {
            amx_pack_a(a_pack, true, pt, nk, nk, nq);
            amx_pack_b(b_pack, do_rows, a.q_rs, nq, a.d);
            amx_tile_product(nk, a.d, nq, 1.0f, a_pack, b_pack, 1.0f, dvt, a.d);
          } else if (bf16_dot) {
            bf16_pack_a_f32(a_words, /*trans_a=*/true, pt, nk, nk, nq);
            bf16_pack_bt(b_words, do_rows, a.q_rs, a.d, nq);
            bf16_tile_gemm(nk, a.d, nq, 1.0f, a_words, b_words, /*accumulate=*/true, dvt, a.d);
          } else {
            tile_gemm(true, nk, a.d, nq, 1.0f, pt, nk, dor.ptr, dor.ld, 1.0f, dvt, a.d);
          }
          // dP (nq, nk) = dO V^T; dS = P * (dP - D).
          if (in_place) {
            amx_tile_product_rows(nq, nk, a.d, 1.0f, do_rows, a.q_rs, vt_pack, 0.0f, dpt, nk);
          } else if (amx) {
            amx_pack_a(a_pack, do_rows, a.q_rs, nq, a.d);
            amx_tile_product(nq, nk, a.d, 1.0f, a_pack, vt_pack, 0.0f, dpt, nk);
          } else if (bf16_dot) {
            bf16_pack_a(rows_packed, do_rows, a.q_rs, nq, a.d);
            bf16_tile_gemm(nq, nk, a.d, 1.0f, rows_packed, reinterpret_cast<const uint32_t*>(vtt), false, dpt, nk);
          } else {
            tile_gemm(false, nq, nk, a.d, 1.0f, dor.ptr, dor.ld, vtt, nk, 0.0f, dpt, nk);
          }
          // On AMX, dS is scaled here (then rounded to bf16 once), so that its products add into
          // dK and dQ through the tiles (amx_tile_product with alpha 1).
          const float ds_scale = amx ? a.scale : 1.0f;
          for (int64_t i = 0; i < nq; ++i) {
            const float di = delta[hq * a.sq + q0 + i];
            float* prow = pt + i * nk;
            const float* dprow = dpt + i * nk;
#pragma omp simd
            for (int64_t j = 0; j < nk; ++j) prow[j] = ds_scale * (prow[j] * (dprow[j] - di));
          }
          // dK (nk, D) += scale dS^T Q;  dQ part (nq, D) = scale dS K.
          if (amx) {
            amx_pack_a(a_pack, true, pt, nk, nk, nq);
            amx_pack_b(b_pack, q_rows, a.q_rs, nq, a.d);
            amx_tile_product(nk, a.d, nq, 1.0f, a_pack, b_pack, 1.0f, dkt, a.d);
            amx_pack_a(a_pack, false, pt, nk, nq, nk);
            amx_tile_product(nq, a.d, nk, 1.0f, a_pack, k_pack, 1.0f, dq_mine + q0 * acc_rs + hq * a.d, acc_rs);
          } else if (bf16_dot) {  // dS rounded to bf16 once, the scale applied to the products
            bf16_pack_a_f32(a_words, /*trans_a=*/true, pt, nk, nk, nq);
            bf16_pack_bt(b_words, q_rows, a.q_rs, a.d, nq);
            bf16_tile_gemm(nk, a.d, nq, a.scale, a_words, b_words, /*accumulate=*/true, dkt, a.d);
            bf16_pack_a_f32(a_words, /*trans_a=*/false, pt, nk, nq, nk);
            bf16_tile_gemm(nq, a.d, nk, a.scale, a_words, k_words, /*accumulate=*/true,
                           dq_mine + q0 * acc_rs + hq * a.d, acc_rs);
          } else {
            tile_gemm(true, nk, a.d, nq, a.scale, pt, nk, qr.ptr, qr.ld, 1.0f, dkt, a.d);
            tile_gemm(false, nq, a.d, nk, a.scale, pt, nk, kr.ptr, kr.ld, 1.0f, dq_mine + q0 * acc_rs + hq * a.d,
                      acc_rs);
          }
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        if (a.acc_dkv) {  // fp32 sums of the caller's (f32_results)
          float* dkr = static_cast<float*>(at(dk, a.out_dtype, k0 + j, a.kv_rs, kvh, a.d));
          float* dvr = static_cast<float*>(at(dv, a.out_dtype, k0 + j, a.kv_rs, kvh, a.d));
#pragma omp simd
          for (int64_t e = 0; e < a.d; ++e) {
            dkr[e] += dkt[j * a.d + e];
            dvr[e] += dvt[j * a.d + e];
          }
          continue;
        }
        store_f32(at(dk, a.out_dtype, k0 + j, a.kv_rs, kvh, a.d), a.out_dtype, dkt + j * a.d, a.d);
        store_f32(at(dv, a.out_dtype, k0 + j, a.kv_rs, kvh, a.d), a.out_dtype, dvt + j * a.d, a.d);
      }
    }
  }

  // Step 3: dQ = sum of the accumulators in thread order, stored in dq's dtype.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < a.sq; ++i) {
    int64_t rs0;
    float* main_row = dq_acc(0, rs0) + i * rs0;
    for (int t = 1; t < threads; ++t) {
      int64_t rs;
      const float* row = dq_acc(t, rs) + i * rs;
      for (int64_t c = 0; c < hd; ++c) main_row[c] += row[c];
    }
    if (!dq_direct) store_f32(at(dq, a.out_dtype, i, a.q_rs, 0, a.d), a.out_dtype, main_row, hd);
  }
}

}  // namespace untied::cpu
